//! The `tailrace` command line.

pub mod bench;
pub mod demo;
pub mod handoff;
pub mod pipelines;
pub mod produce;
pub mod serve;
pub mod tail;
