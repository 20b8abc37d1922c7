//! Integration tests of the wire formats: peer frames and the pinned (golden) encodings. One test
//! binary for the crate, so its dependencies are linked once; one module per concern.

mod golden;
mod peer_frames;
