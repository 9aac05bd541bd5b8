//! Parses a trace and counts its ops: a target for measuring the reader.
//!
//! `cargo run --release --example parse_bench -- FILE` (or `gen N FILE` to write a trace of `N`
//! typical launch lines first).

use std::io::{BufReader, BufWriter, Write};

use streamsan::trace::TraceReader;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, n, file] if cmd == "gen" => {
            let n: u64 = n.parse()?;
            let mut out = BufWriter::new(std::fs::File::create(file)?);
            for i in 0..n {
                writeln!(
                    out,
                    r#"{{"op":"launch","stream":"s{}","name":"k","reads":["b{}",{{"buffer":"t{}","offset":0,"bytes":4096}}],"writes":["b{}"]}}"#,
                    i % 8,
                    i % 100,
                    i % 10,
                    (i + 1) % 100
                )?;
            }
            out.flush()?;
        }
        [file] => {
            let mut reader = TraceReader::new(BufReader::new(std::fs::File::open(file)?), file);
            let mut regions = 0usize;
            while let Some((op, _spans)) = reader.next_op()? {
                if let streamsan::trace::Op::Launch { reads, writes, .. } = &op.op {
                    regions += reads.len() + writes.len();
                }
            }
            println!("{} ops, {} regions", reader.ops_read(), regions);
        }
        _ => return Err("usage: parse_bench FILE | parse_bench gen N FILE".into()),
    }
    Ok(())
}
