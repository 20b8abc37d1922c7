//! A FIFO of records in copy-on-write chunks: the request-id ring's storage.
//!
//! Records are appended at the back and dropped from the front, never changed in place. They sit
//! in chunks of [`RING_CHUNK_ITEMS`] behind an `Arc`, so cloning the ring copies one pointer per
//! chunk: a snapshot freezes a ring of a hundred thousand records in microseconds and writes it
//! while apply goes on (issue 25). Appending to a tail chunk that a frozen copy still shares
//! copies that chunk first (at most [`RING_CHUNK_ITEMS`] records, once per snapshot); dropping
//! from the front only moves an offset, and a chunk is freed once all its records are dropped, so
//! a ring holds at most one chunk of dropped records beyond its length.
//!
//! Must not depend on: anything but `std` (no clock, no I/O).

use std::collections::VecDeque;
use std::sync::Arc;

/// Records per chunk.
pub(crate) const RING_CHUNK_ITEMS: usize = 1_024;

#[derive(Debug, Clone)]
pub(crate) struct ChunkedRing<T> {
    /// Every chunk but the last holds exactly [`RING_CHUNK_ITEMS`] records.
    chunks: VecDeque<Arc<Vec<T>>>,
    /// Records of the first chunk already dropped.
    head: usize,
    len: usize,
}

impl<T: Clone> ChunkedRing<T> {
    pub(crate) fn new() -> Self {
        ChunkedRing {
            chunks: VecDeque::new(),
            head: 0,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        if index >= self.len {
            return None;
        }
        let position = self.head + index;
        self.chunks
            .get(position / RING_CHUNK_ITEMS)?
            .get(position % RING_CHUNK_ITEMS)
    }

    pub(crate) fn front(&self) -> Option<&T> {
        self.get(0)
    }

    pub(crate) fn push_back(&mut self, value: T) {
        match self.chunks.back_mut() {
            Some(chunk) if chunk.len() < RING_CHUNK_ITEMS => {
                let chunk = Arc::make_mut(chunk);
                // A copied tail chunk has capacity for its length only: no doubling past a chunk.
                chunk.reserve_exact(RING_CHUNK_ITEMS - chunk.len());
                chunk.push(value);
            }
            _ => {
                let mut chunk = Vec::with_capacity(RING_CHUNK_ITEMS);
                chunk.push(value);
                self.chunks.push_back(Arc::new(chunk));
            }
        }
        self.len += 1;
    }

    /// Drops the front record (its memory goes with its chunk's last record).
    pub(crate) fn drop_front(&mut self) {
        if self.len == 0 {
            return;
        }
        self.len -= 1;
        self.head += 1;
        let first_len = self.chunks.front().map_or(0, |chunk| chunk.len());
        if self.head == first_len {
            self.chunks.pop_front();
            self.head = 0;
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks
            .iter()
            .flat_map(|chunk| chunk.iter())
            .skip(self.head)
            .take(self.len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn it_is_a_fifo_across_chunks() {
        let mut ring = ChunkedRing::new();
        let mut model = VecDeque::new();
        let mut next = 0u32;
        // Grow, shrink to empty, grow again: every step agrees with a VecDeque.
        for round in 0..3 {
            for _ in 0..(RING_CHUNK_ITEMS * 2 + 17 + round) {
                ring.push_back(next);
                model.push_back(next);
                next += 1;
            }
            for _ in 0..(RING_CHUNK_ITEMS + 5 * round) {
                ring.drop_front();
                model.pop_front();
            }
            assert_eq!(ring.len(), model.len());
            assert_eq!(ring.front(), model.front());
            assert!(ring.iter().eq(model.iter()));
            for index in [
                0,
                1,
                RING_CHUNK_ITEMS - 1,
                RING_CHUNK_ITEMS,
                model.len() - 1,
            ] {
                assert_eq!(ring.get(index), model.get(index));
            }
            assert_eq!(ring.get(model.len()), None);
        }
        while model.pop_front().is_some() {
            ring.drop_front();
        }
        ring.drop_front();
        assert_eq!(ring.len(), 0);
        assert!(ring.chunks.is_empty());
        assert_eq!(ring.front(), None);
    }

    #[test]
    fn a_clone_is_a_frozen_copy_that_writes_do_not_reach() {
        let count = u32::try_from(RING_CHUNK_ITEMS).unwrap() + 3;
        let mut ring = ChunkedRing::new();
        for i in 0..count {
            ring.push_back(i);
        }
        let frozen = ring.clone();
        for _ in 0..10 {
            ring.drop_front();
        }
        ring.push_back(99_999);
        assert_eq!(frozen.len(), RING_CHUNK_ITEMS + 3);
        assert_eq!(frozen.front(), Some(&0));
        assert!(frozen.iter().copied().eq(0..count));
        assert_eq!(ring.front(), Some(&10));
        assert_eq!(ring.iter().last(), Some(&99_999));
        // The full first chunk is still shared; only the tail was copied.
        assert!(Arc::ptr_eq(&ring.chunks[0], &frozen.chunks[0]));
        assert!(!Arc::ptr_eq(&ring.chunks[1], &frozen.chunks[1]));
    }
}
