//! The workspace test suite: one binary, one module per concern.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod architecture;
mod checker;
mod nemesis;
