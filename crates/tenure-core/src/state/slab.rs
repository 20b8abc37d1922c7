//! A chunked slab: stable `u32` slot numbers for lease records, in fixed-size chunks.
//!
//! Chunks never move once allocated, so growing the slab never copies the records already in it
//! (no multi-megabyte `memcpy` pause inside apply). Freed slots are reused last-freed-first; the
//! free list is part of the replicated state (snapshots keep it), so slot numbers, and every
//! tie broken by them, are identical on every replica.
//!
//! Chunks are shared copy-on-write (`Arc`): cloning a slab copies one pointer per chunk and the
//! free list, not the records, so a snapshot can freeze the state in well under a millisecond
//! and write it while apply goes on (issue 25). A write to a chunk that a frozen copy still
//! shares copies that one chunk first ([`Arc::make_mut`]): at most [`CHUNK_SLOTS`] records, once
//! per chunk per snapshot. When nothing shares a chunk, a write costs one atomic compare-exchange
//! and store (`make_mut`'s uniqueness check).
//!
//! Must not depend on: anything but `std` (no clock, no I/O).

use std::sync::Arc;

/// Slots per chunk. Small, because the first write to a chunk a snapshot's frozen copy still
/// shares copies the whole chunk inside that apply: an entry of 256 random renewals right after a
/// freeze touches about 256 chunks. With 4,096 slots a chunk (about 400 KB of records) that entry
/// took 37 ms median at a million leases in one group, 7.4 ms with 256 slots; with 64 (about
/// 6 KB) it copies about 1.6 MB (`snapshot_pause` measures it). A chunk's own overhead is two
/// words and an `Arc` header, under 1 byte a slot; a freeze copies a pointer per chunk (about
/// 2,500 at the 160,000 leases a group holds at 10M leases over 64 groups).
pub(crate) const CHUNK_SLOTS: usize = 64;

#[derive(Debug, Clone, Default)]
pub(crate) struct Slab<T> {
    chunks: Vec<Arc<Vec<Option<T>>>>,
    /// Slots ever handed out: every slot below this is occupied or in `free`.
    len: u32,
    free: Vec<u32>,
}

impl<T: Clone> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab {
            chunks: Vec::new(),
            len: 0,
            free: Vec::new(),
        }
    }

    /// Occupied slots.
    pub(crate) fn occupied(&self) -> usize {
        self.len as usize - self.free.len()
    }

    /// Slots ever handed out (occupied or free).
    pub(crate) fn high_water(&self) -> u32 {
        self.len
    }

    pub(crate) fn free_list(&self) -> &[u32] {
        &self.free
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&T> {
        let slot = slot as usize;
        self.chunks
            .get(slot / CHUNK_SLOTS)?
            .get(slot % CHUNK_SLOTS)?
            .as_ref()
    }

    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
        let slot = slot as usize;
        let chunk = self.chunks.get_mut(slot / CHUNK_SLOTS)?;
        // Only an occupied slot is worth un-sharing its chunk for.
        chunk.get(slot % CHUNK_SLOTS)?.as_ref()?;
        Arc::make_mut(chunk).get_mut(slot % CHUNK_SLOTS)?.as_mut()
    }

    /// Stores `value` and returns its slot. `None` when all `u32` slots are in use.
    pub(crate) fn insert(&mut self, value: T) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            let cell = self.cell_mut(slot);
            debug_assert!(cell.is_none(), "free slot {slot} is occupied");
            *cell = Some(value);
            return Some(slot);
        }
        let slot = self.len;
        self.len = self.len.checked_add(1)?;
        self.push_cell(Some(value));
        Some(slot)
    }

    /// Removes and returns the value in `slot`, making the slot free.
    pub(crate) fn remove(&mut self, slot: u32) -> Option<T> {
        let slot_index = slot as usize;
        let chunk = self.chunks.get_mut(slot_index / CHUNK_SLOTS)?;
        chunk.get(slot_index % CHUNK_SLOTS)?.as_ref()?;
        let value = Arc::make_mut(chunk)
            .get_mut(slot_index % CHUNK_SLOTS)?
            .take()?;
        self.free.push(slot);
        Some(value)
    }

    /// Iterates over every slot below the high-water mark, occupied or not, in slot order.
    pub(crate) fn iter_slots(&self) -> impl Iterator<Item = (u32, Option<&T>)> {
        self.chunks
            .iter()
            .flat_map(|chunk| chunk.iter())
            .zip(0u32..)
            .map(|(cell, slot)| (slot, cell.as_ref()))
    }

    /// Rebuilds a slab from its slots in order and its free list (snapshot restore).
    /// The caller has checked that `free` names exactly the empty slots.
    pub(crate) fn push_restored(&mut self, cell: Option<T>) -> Option<u32> {
        let slot = self.len;
        self.len = self.len.checked_add(1)?;
        self.push_cell(cell);
        Some(slot)
    }

    pub(crate) fn set_free_list(&mut self, free: Vec<u32>) {
        self.free = free;
    }

    fn push_cell(&mut self, cell: Option<T>) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK_SLOTS => {
                let chunk = Arc::make_mut(chunk);
                // A copied tail chunk has capacity for its length only; never let it grow past
                // a chunk by doubling.
                chunk.reserve_exact(CHUNK_SLOTS - chunk.len());
                chunk.push(cell);
            }
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK_SLOTS);
                chunk.push(cell);
                self.chunks.push(Arc::new(chunk));
            }
        }
    }

    fn cell_mut(&mut self, slot: u32) -> &mut Option<T> {
        let slot = slot as usize;
        &mut Arc::make_mut(&mut self.chunks[slot / CHUNK_SLOTS])[slot % CHUNK_SLOTS]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_slots_are_reused_last_freed_first() {
        let mut slab = Slab::new();
        let a = slab.insert("a").unwrap();
        let b = slab.insert("b").unwrap();
        let c = slab.insert("c").unwrap();
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(slab.remove(a), Some("a"));
        assert_eq!(slab.remove(c), Some("c"));
        assert_eq!(slab.remove(c), None);
        assert_eq!(slab.occupied(), 1);
        assert_eq!(slab.insert("d"), Some(c));
        assert_eq!(slab.insert("e"), Some(a));
        assert_eq!(slab.insert("f"), Some(3));
        assert_eq!(slab.get(c), Some(&"d"));
        assert_eq!(slab.get(99), None);
    }

    #[test]
    fn slots_stay_put_across_chunk_boundaries() {
        let mut slab = Slab::new();
        let count = u32::try_from(CHUNK_SLOTS).unwrap() * 2 + 5;
        for i in 0..count {
            assert_eq!(slab.insert(i), Some(i));
        }
        for i in 0..count {
            assert_eq!(slab.get(i), Some(&i));
        }
        assert_eq!(slab.iter_slots().count(), CHUNK_SLOTS * 2 + 5);
    }

    #[test]
    fn a_clone_is_a_frozen_copy_that_writes_do_not_reach() {
        let mut slab = Slab::new();
        let count = u32::try_from(CHUNK_SLOTS).unwrap() + 10;
        for i in 0..count {
            slab.insert(i);
        }
        let frozen = slab.clone();
        assert!(Arc::ptr_eq(&slab.chunks[0], &frozen.chunks[0]));
        *slab.get_mut(3).unwrap() = 1_000;
        assert_eq!(slab.remove(count - 1), Some(count - 1));
        assert_eq!(slab.insert(7_000), Some(count - 1));
        assert_eq!(slab.insert(7_001), Some(count));
        // The frozen copy still shows the state at the moment it was taken.
        assert_eq!(frozen.get(3), Some(&3));
        assert_eq!(frozen.get(count - 1), Some(&(count - 1)));
        assert_eq!(frozen.get(count), None);
        assert_eq!(frozen.high_water(), count);
        assert!(frozen.free_list().is_empty());
        // Only the chunks written to were copied; reading never copies.
        assert!(!Arc::ptr_eq(&slab.chunks[0], &frozen.chunks[0]));
        let _ = slab.get(5);
        drop(frozen);
        assert_eq!(slab.get(3), Some(&1_000));
        assert_eq!(slab.get(count), Some(&7_001));
    }
}
