//! The write context every fenced write carries: which queue lease, if
//! any, the writer holds.

/// Who writes: the fencing token of the queue lease the writer holds, or
/// nobody's. A receiver's acks and trims, a checkpoint save and a run log
/// append all take one. A store that can fence refuses a write under a
/// token once a newer lease of the queue was granted (or, for the run log,
/// once a newer token appended to the run); a store that cannot fence
/// ignores it. [`Fence::NONE`] (the default) is a writer no lease governs:
/// a single-process node, a tool, a test.
///
/// ```
/// use tailrace::queue::Fence;
///
/// assert_eq!(Fence::default(), Fence::NONE);
/// assert_eq!(Fence::NONE.token(), None);
/// assert_eq!(Fence::lease(7).token(), Some(7));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fence(Option<u64>);

impl Fence {
    /// A writer under no lease: nothing refuses it.
    pub const NONE: Fence = Fence(None);

    /// The owner of the lease granted with fencing token `token`.
    pub const fn lease(token: u64) -> Self {
        Self(Some(token))
    }

    /// The fencing token, if a lease governs the writer.
    pub const fn token(self) -> Option<u64> {
        self.0
    }
}

impl From<Option<u64>> for Fence {
    fn from(token: Option<u64>) -> Self {
        Self(token)
    }
}
