//! Rewinds: a subscription whose start the cache no longer holds waits for
//! a re-read from the queue (on a rewindable adapter), bounded in number
//! and in room, and its cursor is placed when the read arrives.

use super::*;

impl Streams {
    /// A catching-up subscription needs a rewind read (by the next pump).
    pub(crate) fn request_rewind(&mut self, stream: StreamId, id: SubscriptionId) {
        self.rewinds.push_back((stream, id));
    }

    pub(crate) fn rewinds_waiting(&self) -> bool {
        !self.rewinds.is_empty()
    }

    /// The rewind reads of the next pump: at most `most`, each up to `room`.
    pub(crate) fn take_rewinds(&mut self, most: usize, room: usize) -> Vec<RewindJob> {
        let mut jobs = Vec::new();
        while jobs.len() < most {
            let Some((stream, id)) = self.rewinds.pop_front() else {
                break;
            };
            let catch_up = self.sub_mut(&stream, id).and_then(|s| s.catch_up.as_ref());
            if let Some(catch_up) = catch_up {
                let (from, epoch) = (catch_up.next, catch_up.epoch);
                jobs.push(RewindJob { stream, id, epoch, from, max: room });
            }
        }
        jobs
    }

    /// A rewind read for a catching-up subscription came back. The first
    /// answer also settles a strict attach: served, or refused clearly.
    pub(crate) fn on_rewind(
        &mut self,
        rewind: RewindResult,
        cache: &mut QueueCache,
        reader_backoff: Backoff,
    ) -> Vec<Next> {
        let mut next = Vec::new();
        let RewindResult { stream, id, epoch, result } = rewind;
        let Some(sub) = self.sub_mut(&stream, id) else { return next };
        match sub.rewound(&stream, epoch, result, reader_backoff) {
            Rewound::Stale => return next,
            Rewound::Retry { after } => {
                next.push(Next::RewindLater { stream, id, epoch, after });
                return next;
            }
            Rewound::Served => {}
            Rewound::Refused(reason, oldest) => {
                next.push(Next::CacheMiss);
                let refusal = AttachError::CannotStart { id, requested: format!("{:?}", sub.start), reason, oldest };
                self.remove_sub(&stream, id, refusal, cache);
                return next;
            }
            Rewound::Lost(reason) => {
                next.push(Next::CacheMiss);
                if let Some(consumer) = sub.consumer.clone() {
                    next.push(Next::Tell { consumer, info: sub.info.clone(), error: reason });
                }
            }
        }
        next.push(Next::Dispatch(stream, id));
        next
    }

    /// A delayed rewind is due: ask again (unless the catch-up changed).
    pub(crate) fn on_rewind_due(&mut self, stream: StreamId, id: SubscriptionId, epoch: u64) -> Vec<Next> {
        let catch_up = self.sub_mut(&stream, id).and_then(|s| s.catch_up.as_mut());
        match catch_up.filter(|c| c.epoch == epoch) {
            Some(catch_up) => {
                catch_up.requested = false;
                vec![Next::Dispatch(stream, id)]
            }
            None => Vec::new(),
        }
    }
}
