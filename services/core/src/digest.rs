//! Canonical, length-prefixed hashing shared by event ids and trigger keys.
//!
//! Every field is written as `len:u32 big-endian ‖ bytes`, so no two different
//! field sequences can produce the same byte stream (no `"a|b" == "a" + "|b"`).

use sha2::{Digest, Sha256};

pub(crate) struct Canonical(Sha256);

impl Canonical {
    pub(crate) fn new(domain: &str) -> Self {
        let mut c = Canonical(Sha256::new());
        c.str(domain);
        c
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        // Lengths beyond u32 cannot occur for keys and ids; saturate rather than panic.
        let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
        self.0.update(len.to_be_bytes());
        self.0.update(b);
        self
    }

    pub(crate) fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }

    /// The first `n` bytes of the digest, hex encoded.
    pub(crate) fn hex(self, n: usize) -> String {
        let out = self.0.finalize();
        hex::encode(&out[..n.min(out.len())])
    }
}
