//! Test fixtures over this crate's own types, for its unit tests and, with
//! the cargo feature `test-fixtures`, for the test kit (one copy of each):
//! a scripted adapter that serves what a test gives it and records every
//! call, a pub-sub store whose writes a test can hold, a recording consumer.

pub mod recorder;
pub mod scripted;
pub mod store;
