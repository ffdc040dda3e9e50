//! Which layer of a chain holds each chunk: one byte per chunk (0 = the base, i = the
//! i-th layer from the bottom), so a read finds its source in O(1) however long the chain,
//! and a run of chunks from one source is read with one call. 1 byte per 4 KiB chunk:
//! 256 KiB of memory per GiB of disk.

/// Longest chain (layers including the top) a disk may have; `flatten` shortens longer
/// ones. Well under u8::MAX so a layer number always fits the index.
pub const MAX_LAYERS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerIndex {
    sources: Vec<u8>,
}

impl LayerIndex {
    /// An index of `chunks` chunks, all from the base.
    pub fn new(chunks: u64) -> LayerIndex {
        LayerIndex {
            sources: vec![0; chunks as usize],
        }
    }

    /// Layer `number` (above every layer added before) holds the chunks set in `bitmap`
    /// (bit i%8 of byte i/8 = chunk i). Bits past the end of the disk are ignored.
    pub fn add_layer(&mut self, bitmap: &[u8], number: u8) {
        for (byte_index, &byte) in bitmap.iter().enumerate() {
            if byte == 0 {
                continue;
            }
            for bit in 0..8 {
                if byte & (1 << bit) != 0
                    && let Some(s) = self.sources.get_mut(byte_index * 8 + bit)
                {
                    *s = number;
                }
            }
        }
    }

    /// The layer holding `chunk` (0 for the base, and for chunks past the end).
    pub fn get(&self, chunk: u64) -> u8 {
        self.sources.get(chunk as usize).copied().unwrap_or(0)
    }

    pub fn set(&mut self, chunk: u64, number: u8) {
        if let Some(s) = self.sources.get_mut(chunk as usize) {
            *s = number;
        }
    }

    /// The source of `first` and how many chunks from `first` up to `last` (inclusive)
    /// share it (at least 1).
    pub fn run(&self, first: u64, last: u64) -> (u8, u64) {
        let source = self.get(first);
        let mut n = 1;
        while first + n <= last && self.get(first + n) == source {
            n += 1;
        }
        (source, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_layers_win_and_runs_group_by_source() {
        let mut idx = LayerIndex::new(20);
        idx.add_layer(&[0b0000_1111, 0, 0], 1); // chunks 0-3
        idx.add_layer(&[0b0000_0110, 0b0000_0001, 0], 2); // chunks 1, 2, 8
        assert_eq!(
            (0..10).map(|c| idx.get(c)).collect::<Vec<_>>(),
            vec![1, 2, 2, 1, 0, 0, 0, 0, 2, 0]
        );
        assert_eq!(idx.run(0, 19), (1, 1));
        assert_eq!(idx.run(1, 19), (2, 2));
        assert_eq!(idx.run(4, 19), (0, 4));
        assert_eq!(idx.run(4, 5), (0, 2), "a run stops at `last`");
        idx.set(5, 3);
        assert_eq!(idx.run(4, 19), (0, 1));
        assert_eq!(idx.get(5), 3);
    }

    #[test]
    fn bits_past_the_disk_and_chunks_past_the_end_are_harmless() {
        let mut idx = LayerIndex::new(3);
        idx.add_layer(&[0xff, 0xff], 1);
        assert_eq!(idx.get(2), 1);
        assert_eq!(idx.get(3), 0);
        idx.set(100, 4);
        assert_eq!(idx.get(100), 0);
    }
}
