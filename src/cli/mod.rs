//! The `tailrace` command line.

pub mod bench;
pub mod demo;
pub mod handoff;
pub mod serve;
