//! Text for people: user-supplied strings made safe to print, and long values clipped.
//!
//! Everything a trace names — stream, event and buffer ids, kernel names, sites — comes from
//! whoever wrote the trace. Printed raw, an id holding `ESC [ 2 J` clears the screen, and one
//! holding a newline can fake a line of the report (`streamsan: no hazards in 3 ops`). Every text
//! renderer (the text report, `why:` lines, fix sentences, the comments and summary of `streamsan
//! fix`, error messages) passes such text through [`escape`], which writes each control
//! character as a visible escape, the way Rust writes them: `\n`, `\r`, `\t`, `\u{1b}`, and so
//! on — with or without colour. Machine-readable outputs (the JSON report, SARIF) are left alone:
//! JSON escapes control characters itself.
//!
//! Bad input is echoed in error messages (an unknown op name, an over-long number); [`clip`] cuts
//! such a value to [`ECHO_CHARS`] characters and ends it with an ellipsis, so that a message
//! stays a line long whatever the input. [`clip_middle`] keeps both ends of a whole message.

use std::borrow::Cow;
use std::fmt::Write as _;

/// How many characters of a value an error message echoes before cutting it with `…`.
pub const ECHO_CHARS: usize = 64;

/// How many characters of a whole message [`clip_middle`] keeps by default.
pub const MESSAGE_CHARS: usize = 1024;

/// Whether `c` must not reach a terminal as it is: the C0 and C1 control characters and DEL
/// (`char::is_control`), and the invisible characters that reorder or break lines (bidirectional
/// overrides and isolates, the line and paragraph separators), which can make text read as
/// something it is not.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with every [unsafe](is_unsafe) character written as its escape (`\n`, `\t`, `\r`,
/// `\u{1b}`, `\u{202e}`, …); borrowed when there is none, which is the common case.
///
/// ```
/// use streamsan::text::escape;
/// assert_eq!(escape("s1"), "s1");
/// assert_eq!(escape("a\u{1b}[2Jb\nc"), r"a\u{1b}[2Jb\nc");
/// ```
pub fn escape(text: &str) -> Cow<'_, str> {
    // Every unsafe character is below 0x20, is DEL, or is encoded with a lead byte of 0xC2
    // (C1), 0xD8 (U+061C) or 0xE2 (U+2xxx): other text goes through untouched.
    let suspicious = |b: &u8| *b < 0x20 || matches!(*b, 0x7f | 0xc2 | 0xd8 | 0xe2);
    if !text.as_bytes().iter().any(suspicious) || !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` cut to its first `max` characters followed by `…` when it is longer (never in the
/// middle of a character); borrowed when it is not.
///
/// ```
/// use streamsan::text::clip;
/// assert_eq!(clip("lanch", 64), "lanch");
/// assert_eq!(clip("abcdef", 3), "abc…");
/// ```
pub fn clip(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!("{}…", &text[..end])),
    }
}

/// `text` with its middle replaced by ` … ` when it has more than `max` characters: the first
/// two thirds and the last third of `max` are kept, so that both what a message is about and
/// how it ends (`… is already allocated; expected …`) stay readable.
///
/// ```
/// use streamsan::text::clip_middle;
/// assert_eq!(clip_middle("short", 10), "short");
/// assert_eq!(clip_middle("0123456789abcdef", 9), "012345 … def");
/// ```
pub fn clip_middle(text: &str, max: usize) -> Cow<'_, str> {
    let chars = text.chars().count();
    if chars <= max {
        return Cow::Borrowed(text);
    }
    let head = max - max / 3;
    let tail = max / 3;
    let head_end = text.char_indices().nth(head).map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .nth(chars - tail)
        .map_or(text.len(), |(i, _)| i);
    Cow::Owned(format!("{} … {}", &text[..head_end], &text[tail_start..]))
}

/// A message for a terminal: [`clip_middle`] to [`MESSAGE_CHARS`], then [`escape`].
pub fn for_terminal(message: &str) -> String {
    escape(&clip_middle(message, MESSAGE_CHARS)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_control_character() {
        assert_eq!(escape("plain id, é, 流"), "plain id, é, 流");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(escape("\u{1b}[2J"), r"\u{1b}[2J");
        assert_eq!(escape("a\nb\r\tc\0"), r"a\nb\r\tc\u{0}");
        assert_eq!(escape("\u{7f}\u{9b}"), r"\u{7f}\u{9b}");
        assert_eq!(escape("x\u{202e}y\u{2028}"), r"x\u{202e}y\u{2028}");
        // Other characters with the same lead bytes are kept.
        assert_eq!(escape("é — ‘’ ↔ ؛"), "é — ‘’ ↔ ؛");
        for c in (0u32..0x110000).filter_map(char::from_u32) {
            let s = c.to_string();
            let e = escape(&s);
            assert!(!e.chars().any(is_unsafe), "{c:?} escaped to {e:?}");
            assert_eq!(is_unsafe(c), e != s, "{c:?}");
        }
    }

    #[test]
    fn clips_values_and_messages() {
        assert_eq!(clip("", 3), "");
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("ééééé", 2), "éé…");
        let long = "x".repeat(10_000);
        assert_eq!(clip(&long, ECHO_CHARS).chars().count(), ECHO_CHARS + 1);
        let m = format!("stream \"{long}\" already exists with device 0");
        let c = clip_middle(&m, 90);
        assert!(c.starts_with("stream \"xxx"), "{c}");
        assert!(c.ends_with("\" already exists with device 0"), "{c}");
        assert!(c.chars().count() <= 93, "{c}");
        assert_eq!(clip_middle("ééé", 3), "ééé");
    }
}
