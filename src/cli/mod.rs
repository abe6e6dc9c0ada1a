//! The `tailrace` command line.

pub mod bench;
