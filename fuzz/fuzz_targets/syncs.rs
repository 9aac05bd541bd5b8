#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../common.rs"]
#[allow(dead_code)]
mod common;

fuzz_target!(|data: &[u8]| {
    common::check_syncs(data);
});
