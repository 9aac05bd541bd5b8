//! The general path: an op object in any valid JSON spelling — keys in any order, whitespace,
//! escapes — with the error the format's order of errors puts first.

use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::error::{bad, found, from_serde, Path, Scan};
use super::fields::{build, key_from_name, kind_from_word, missing, op_names, Fields};
use super::scan::Scanner;
use super::spans::{key_slot, Spans};
use crate::trace::schema::{Key, Kind, Type};
use crate::trace::TraceOp;

impl<'a> Scanner<'a> {
    /// The op name at the current position.
    pub(super) fn op_name(&mut self) -> Scan<Kind> {
        let start = self.pos;
        if self.peek() != Some(b'"') {
            let what = found(self.peek());
            let message = format!("field \"op\" is {what}");
            return Err(bad(start, message, Some(&op_names())));
        }
        match kind_from_word(self.word()?) {
            Some(kind) => Ok(kind),
            None => {
                let message = format!("unknown op {:?}", self.text_at(start));
                Err(bad(start, message, Some(&op_names())))
            }
        }
    }

    /// The op object that starts at the current (non-blank) position, up to the end of the line.
    pub(super) fn op_line(&mut self, spans: &mut Spans) -> Scan<TraceOp> {
        let obj = self.pos;
        if self.peek() != Some(b'{') {
            let what = found(self.peek());
            return Err(bad(
                obj,
                format!("the line is {what}"),
                Some("a JSON object"),
            ));
        }
        spans.columns[0] = obj as u64 + 1;
        self.pos += 1;
        self.ws();

        // The op first: from the first key, or from a search when it is not first.
        let mut seen = 0u32;
        let kind = if self.rest_at(self.pos).starts_with(b"\"op\"") {
            self.pos += 4;
            self.eat(b':')?;
            self.ws();
            seen |= Key::Op.bit();
            self.op_name()?
        } else {
            let Some(at) = find_op(self.slice(0, self.b.len())?)? else {
                let message = "missing field \"op\"".to_owned();
                return Err(bad(obj, message, Some(&op_names())));
            };
            let resume = self.pos;
            self.pos = at;
            let kind = self.op_name()?;
            self.pos = resume;
            kind
        };

        let allowed = kind.allowed();
        let mut f = Fields::default();
        let mut after_value = seen != 0;
        loop {
            if after_value {
                match self.peek_ws() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.syntax()),
                }
            }
            after_value = true;
            if self.peek_ws() != Some(b'"') {
                return Err(self.syntax());
            }
            let key_pos = self.pos;
            let key = match key_from_name(self.name()?) {
                Some(key) if allowed & key.bit() != 0 => key,
                _ => {
                    let text = self.text_at(key_pos);
                    let message = format!("unknown field {text:?} for op \"{}\"", kind.name());
                    return Err(bad(key_pos, message, Some(&kind.expected_keys())));
                }
            };
            if seen & key.bit() != 0 {
                let message = format!("duplicate field \"{}\"", key.name());
                return Err(bad(key_pos, message, Some("each field at most once")));
            }
            seen |= key.bit();
            self.eat(b':')?;
            self.ws();
            let at = self.pos;
            if let Some(s) = key_slot(key) {
                spans.columns[s] = at as u64 + 1;
            }
            let path = Path::key(key);
            match key {
                // The first "op" of a line whose op is not its first key: already read.
                Key::Op => {
                    self.string()?;
                }
                Key::Stream => f.stream = Some(self.stream_id(path)?),
                Key::Event => f.event = Some(self.id(path)?),
                Key::Buffer if kind.field(key).is_some_and(|f| f.ty == Type::Region) => {
                    f.region = Some(self.region(path)?);
                }
                Key::Buffer => f.buffer = Some(self.id(path)?),
                Key::Bytes => f.bytes = Some(self.u64_value(path)?),
                Key::Addr => {
                    f.addr_pos = at;
                    f.addr = Some(self.u64_value(path)?);
                }
                Key::Memory => f.memory = Some(self.memory(path)?),
                Key::Device => f.device = Some(self.u64_value(path)?),
                Key::Blocking => f.blocking = Some(self.bool_value(path)?),
                Key::Complete => f.complete = Some(self.bool_value(path)?),
                Key::Name => f.name = Some(self.string_value(path, "a string")?),
                Key::Reads => f.reads = self.regions(key, &mut spans.reads)?,
                Key::Writes => f.writes = self.regions(key, &mut spans.writes)?,
                Key::Src => f.src = Some(self.region(path)?),
                Key::Dst => f.dst = Some(self.region(path)?),
                Key::Site => f.site = Some(self.site()?),
                Key::Graph => f.graph = Some(self.id(path)?),
                Key::Pool => f.pool = Some(self.id(path)?),
            }
        }
        if self.peek_ws().is_some() {
            return Err(self.syntax());
        }
        if let Some(field) = kind.first_missing(seen) {
            return Err(missing(kind, field.key, obj));
        }
        build(kind, &mut f, obj)
    }
}

// ---------------------------------------------------------------------------------------------
// Finding "op" when it is not the first key (rare): serde_json reads the whole line.

/// The position of the value of the first `"op"` key of the object `line`, if it has one.
pub(super) fn find_op(line: &str) -> Scan<Option<usize>> {
    let mut de = serde_json::Deserializer::from_str(line);
    let found = serde::Deserializer::deserialize_map(&mut de, FindOp)
        .and_then(|found| de.end().map(|()| found))
        .map_err(|e| Box::new(from_serde(&e, 0, "invalid JSON")))?;
    Ok(found.map(|raw| raw.get().as_ptr() as usize - line.as_ptr() as usize))
}

struct FindOp;

impl<'de> Visitor<'de> for FindOp {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_op) = map.next_key_seed(IsOp)? {
            if is_op && found.is_none() {
                found = Some(map.next_value::<&RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Deserializes a key into whether it is `"op"`.
struct IsOp;

impl<'de> DeserializeSeed<'de> for IsOp {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for IsOp {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == "op")
    }
}
