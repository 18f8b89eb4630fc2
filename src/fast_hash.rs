//! A cheap hasher for the runtime's own tables.
//!
//! Every key hashed on a hot path is an integer the runtime issued itself
//! (block generations, stream ids, raw stream handles, runtime tokens) or a
//! short tag string that stays in a bounded per-thread cache. None needs
//! protection against collision flooding, and SipHash (the std default)
//! cost a tenth of an allocate+free pair in profiles. Multiplying by an odd
//! constant is a bijection on the low bits (so sequential ids spread over
//! buckets) and mixes every input bit into the high bits (which hashbrown
//! uses as its per-slot tag).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-xor hasher; see the module docs for why it is enough here.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl FastHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(23) ^ word).wrapping_mul(MULTIPLIER);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.mix(u64::from(v));
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.mix(u64::from(v));
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.mix(v);
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.mix(v as u64);
    }
}

/// `HashMap` with `FastHasher`.
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash<T: Hash>(v: T) -> u64 {
        BuildHasherDefault::<FastHasher>::default().hash_one(v)
    }

    #[test]
    fn sequential_ids_spread_over_low_and_high_bits() {
        let low: std::collections::HashSet<u64> = (1u64..=1024).map(|g| hash(g) & 1023).collect();
        assert_eq!(low.len(), 1024, "low 10 bits of 1024 sequential ids are a permutation");
        let high: std::collections::HashSet<u64> = (1u64..=1024).map(|g| hash(g) >> 57).collect();
        assert!(high.len() > 100, "top 7 bits take {} of 128 values", high.len());
    }

    #[test]
    fn strings_differ_by_content_and_length() {
        assert_ne!(hash("abc"), hash("abd"));
        assert_ne!(hash("a"), hash("a\0"));
        assert_ne!(hash("exactly8"), hash("exactly8\0"));
        let mut m: FastMap<String, u32> = FastMap::default();
        for i in 0..1000 {
            m.insert(format!("tag-{i}"), i);
        }
        assert!((0..1000).all(|i| m[&format!("tag-{i}")] == i));
    }
}
