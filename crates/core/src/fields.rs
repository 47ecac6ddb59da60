//! Test-only: bytes built field by field, as Kafka's schemas lay them out, to check encoders
//! against and to feed decoders.

/// Big-endian fields back to back.
#[derive(Default)]
pub(crate) struct Fields(pub(crate) Vec<u8>);

impl Fields {
    pub(crate) fn i8(mut self, v: i8) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// `STRING`: int16 length, UTF-8.
    pub(crate) fn string(self, s: &str) -> Self {
        let w = self.i16(i16::try_from(s.len()).expect("a test string under 32 KiB"));
        w.raw(s.as_bytes())
    }
    /// `BYTES`: int32 length, bytes.
    pub(crate) fn bytes(self, v: &[u8]) -> Self {
        let w = self.i32(i32::try_from(v.len()).expect("test bytes under 2 GiB"));
        w.raw(v)
    }
    pub(crate) fn uvarint(mut self, mut v: u32) -> Self {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(b);
                return self;
            }
            self.0.push(b | 0x80);
        }
    }
    /// `COMPACT_STRING`: unsigned varint length + 1, UTF-8.
    pub(crate) fn compact_string(self, s: &str) -> Self {
        let w = self.uvarint(u32::try_from(s.len() + 1).expect("a short test string"));
        w.raw(s.as_bytes())
    }
    pub(crate) fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
    /// Prefixed with its int32 size, as a request or answer frame is sent.
    pub(crate) fn framed(self) -> Vec<u8> {
        Fields::default().bytes(&self.0).0
    }
}
