//! The `tailrace` command line.

pub mod bench;
pub mod demo;
