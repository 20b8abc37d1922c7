//! The workspace test suite: one binary, one module per concern.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod architecture;
