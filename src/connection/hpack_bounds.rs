//! Where the fields of a client's HPACK block begin and end, read from the
//! representations' own lengths (RFC 7541 §5 and §6) without the dynamic
//! table: enough to know whether a block ends on a field boundary, so that
//! a field appended after it is read as a field of its own and cannot be
//! swallowed by one the client left unfinished.
//!
//! The reading follows the h2 crate's decoder where it could differ: an
//! integer takes at most 5 bytes, the prefix included. A block the decoder
//! would refuse may read here as unfinished or broken; either way nothing is
//! appended to it.

/// What an integer being read will be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IntegerOf {
    /// An indexed field's index, or a table size update: the whole field.
    WholeField,
    /// A literal's name index: 0 means a name string comes before the value.
    LiteralName,
    /// A string's length.
    StringLength,
}

/// The integers' longest encoding the h2 decoder reads, in bytes.
const MOST_INTEGER_BYTES: u8 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Integer {
    value: u64,
    shift: u32,
    bytes: u8,
    of: IntegerOf,
}

/// A header block's reading so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct HpackBounds {
    integer: Option<Integer>,
    /// Strings the current literal still owes (its name and value, or its
    /// value).
    strings_owed: u8,
    /// Bytes of the current string still to come.
    string_left: u64,
    broken: bool,
}

impl HpackBounds {
    /// Whether the block read so far ends where a field ends.
    pub(super) fn at_field_boundary(&self) -> bool {
        !self.broken && self.integer.is_none() && self.strings_owed == 0 && self.string_left == 0
    }

    /// The block is refused for what surrounds it (a frame the h2 server
    /// refuses): no field may follow it.
    pub(super) fn refuse(&mut self) {
        self.broken = true;
    }

    /// Reads the next bytes of the block.
    pub(super) fn read(&mut self, mut bytes: &[u8]) {
        while let Some((&byte, rest)) = bytes.split_first() {
            if self.broken {
                return;
            }
            if self.string_left > 0 {
                // A string's bytes say nothing of the structure: skipped
                // as a run.
                let n = usize::try_from(self.string_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.string_left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            bytes = rest;
            if let Some(mut integer) = self.integer.take() {
                integer.bytes += 1;
                integer.value += u64::from(byte & 0x7f) << integer.shift;
                integer.shift += 7;
                if byte & 0x80 == 0 {
                    self.integer_read(integer.value, integer.of);
                } else if integer.bytes == MOST_INTEGER_BYTES {
                    self.broken = true;
                } else {
                    self.integer = Some(integer);
                }
            } else if self.strings_owed > 0 {
                self.strings_owed -= 1;
                self.integer_starts(byte, 7, IntegerOf::StringLength);
            } else {
                // A field's first byte: its kind, and its integer's prefix.
                let (prefix, of) = match byte {
                    0x80..=0xff => (7, IntegerOf::WholeField),
                    0x40..=0x7f => (6, IntegerOf::LiteralName),
                    0x20..=0x3f => (5, IntegerOf::WholeField),
                    _ => (4, IntegerOf::LiteralName),
                };
                self.integer_starts(byte, prefix, of);
            }
        }
    }

    fn integer_starts(&mut self, byte: u8, prefix: u32, of: IntegerOf) {
        let mask = (1u8 << prefix) - 1;
        let value = byte & mask;
        if value < mask {
            self.integer_read(u64::from(value), of);
        } else {
            self.integer = Some(Integer {
                value: u64::from(value),
                shift: 0,
                bytes: 1,
                of,
            });
        }
    }

    fn integer_read(&mut self, value: u64, of: IntegerOf) {
        match of {
            IntegerOf::WholeField => {}
            IntegerOf::LiteralName => self.strings_owed = if value == 0 { 2 } else { 1 },
            IntegerOf::StringLength => self.string_left = value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds_after(block: &[u8]) -> HpackBounds {
        let mut bounds = HpackBounds::default();
        bounds.read(block);
        bounds
    }

    /// Every split of the block reads alike: frames and reads cut it
    /// anywhere.
    fn ends_on_boundary(block: &[u8]) -> bool {
        let whole = bounds_after(block);
        for cut in 0..=block.len() {
            let mut split = HpackBounds::default();
            split.read(&block[..cut]);
            split.read(&block[cut..]);
            assert_eq!(split, whole, "cut at {cut}");
        }
        let mut by_byte = HpackBounds::default();
        for b in block {
            by_byte.read(std::slice::from_ref(b));
        }
        assert_eq!(by_byte, whole);
        whole.at_field_boundary()
    }

    #[test]
    fn whole_fields_of_every_kind_end_on_a_boundary() {
        // RFC 7541 C.3.1: :method GET, :scheme http, :path /, :authority
        // www.example.com (indexed, and a literal with an indexed name).
        let c31 = b"\x82\x86\x84\x41\x0fwww.example.com";
        assert!(ends_on_boundary(c31));
        // C.4.1, the same with Huffman strings.
        let c41 = b"\x82\x86\x84\x41\x8c\xf1\xe3\xc2\xe5\xf2\x3a\x6b\xa0\xab\x90\xf4\xff";
        assert!(ends_on_boundary(c41));
        // C.2.1: a literal with a new name, indexed.
        assert!(ends_on_boundary(b"\x40\x0acustom-key\x0dcustom-header"));
        // C.2.2 and C.2.3: without indexing, never indexed.
        assert!(ends_on_boundary(b"\x04\x0c/sample/path"));
        assert!(ends_on_boundary(b"\x10\x08password\x06secret"));
        // A table size update, then a field.
        assert!(ends_on_boundary(b"\x3f\xe1\x1f\x82"));
        // An index beyond its prefix (C.1.2's 1337 in 5 bits).
        assert!(ends_on_boundary(b"\x1f\x9a\x0a\x00"));
        // A long string: its length takes continuation bytes.
        let mut long = vec![0x00, 0x01, b'x', 0x7f, 0x81, 0x01];
        long.extend(vec![b'a'; 127 + 129]);
        assert!(ends_on_boundary(&long));
        assert!(ends_on_boundary(b""));
    }

    #[test]
    fn a_field_left_unfinished_is_no_boundary() {
        // The attack: a literal whose Huffman value declares 41 bytes and
        // sends none; whatever follows would become its value.
        assert!(!ends_on_boundary(b"\x82\x00\x01x\xa9"));
        // Cut anywhere inside a field.
        let field = b"\x40\x0acustom-key\x0dcustom-header";
        for cut in 1..field.len() {
            assert!(!ends_on_boundary(&field[..cut]), "cut at {cut}");
        }
        // An integer left waiting for its continuation byte.
        assert!(!ends_on_boundary(b"\xff\x80"));
        assert!(!ends_on_boundary(b"\x3f"));
        // Literals owing their strings.
        assert!(!ends_on_boundary(b"\x00"));
        assert!(!ends_on_boundary(b"\x00\x01x"));
        assert!(!ends_on_boundary(b"\x44"));
    }

    #[test]
    fn an_integer_longer_than_the_decoder_reads_is_broken_for_good() {
        // Five bytes, the last still continuing: h2 calls it an overflow.
        let mut bounds = bounds_after(b"\xff\x80\x80\x80\x80");
        assert!(bounds.broken);
        bounds.read(b"\x00\x82");
        assert!(!bounds.at_field_boundary());
        // Five bytes ending there is still an integer.
        assert!(ends_on_boundary(b"\xff\x80\x80\x80\x00"));
    }
}
