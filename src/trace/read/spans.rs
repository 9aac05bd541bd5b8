//! Where an op's fields are in its line: [`Spans`].

use crate::trace::schema::Key;
use crate::trace::Field;

/// Where the fields of one op are in its line: the line, and the 1-based byte column where each
/// present field's value starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spans {
    pub(super) line: u64,
    /// Columns of the object and of the single-valued fields (0: absent), indexed by [`slot`].
    pub(super) columns: [u64; SLOTS],
    /// Columns of the entries of `reads`.
    pub(super) reads: Vec<u64>,
    /// Columns of the entries of `writes`.
    pub(super) writes: Vec<u64>,
}

pub(super) const SLOTS: usize = 13;

/// The index of a single-valued field in [`Spans::columns`].
#[inline(always)]
pub(super) fn slot(field: Field) -> Option<usize> {
    Some(match field {
        Field::Op => 0,
        Field::Stream => 1,
        Field::Event => 2,
        Field::Buffer => 3,
        Field::Bytes => 4,
        Field::Addr => 5,
        Field::Memory => 6,
        Field::Device => 7,
        Field::Blocking => 8,
        Field::Src => 9,
        Field::Dst => 10,
        Field::Graph => 11,
        Field::Pool => 12,
        Field::Read(_) | Field::Write(_) => return None,
    })
}

impl Spans {
    /// The 1-based line of the op (1 for [`parse_line`](super::parse_line)).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// The 1-based byte column where `field`'s value starts, if the op has it. [`Field::Op`] is the
    /// column of the object's opening `{`; [`Field::Read`]`(i)` that of the i-th entry of `reads`.
    pub fn column(&self, field: Field) -> Option<u64> {
        let column = match field {
            Field::Read(i) => self.reads.get(i as usize).copied(),
            Field::Write(i) => self.writes.get(i as usize).copied(),
            _ => slot(field).map(|s| self.columns[s]),
        };
        column.filter(|&c| c != 0)
    }

    /// `(line, column)` of `field`'s value, or of the op's object when the field is absent.
    pub fn locate(&self, field: Field) -> (u64, u64) {
        let column = self.column(field).unwrap_or(self.columns[0]);
        (self.line, column)
    }

    pub(super) fn clear(&mut self) {
        self.columns = [0; SLOTS];
        self.reads.clear();
        self.writes.clear();
    }
}

/// The index in [`Spans`] of the column of `key`'s value, if it keeps one.
#[inline(always)]
pub(super) fn key_slot(key: Key) -> Option<usize> {
    key.field().and_then(slot)
}
