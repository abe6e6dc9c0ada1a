//! A session's hand-over to the fan-out and back: the viewer's place in
//! its run (still attached and registered) out of a session at the head,
//! and a session again for one that fell behind the window.

use super::{Session, Stage, StartAt, Tick};
use crate::edge::fanout::{Handover, Member};

impl Session {
    /// The viewer's place in its run, for the fan-out, once [`Next::HandOver`]
    /// said it is at the head; `None` otherwise. The viewer stays attached
    /// and registered: the [`Handover`]'s member leaves when it is dropped.
    pub(crate) fn into_handover(mut self) -> Option<Handover> {
        if !matches!(self.stage, Stage::HandOver) || !self.attached {
            return None;
        }
        let (tailer, viewer) = (self.tailer.take()?, self.viewer.take()?);
        self.attached = false;
        Some(Handover {
            member: Member::new(self.edge.clone(), tailer, viewer),
            at: self.at,
            replay_until: self.replay_until,
            last_sent: self.last_sent,
        })
    }

    /// The session of a handed-over viewer that fell behind the window:
    /// it reads lines up to `until` from the store (today's catch-up), then
    /// stops at the head again.
    pub(crate) fn resumed(handover: Handover, until: u64) -> Session {
        let Handover { member, at, replay_until, last_sent } = handover;
        let (edge, tailer, viewer) = member.into_parts();
        Session {
            edge,
            key: tailer.key().clone(),
            start: StartAt::Offset(at),
            connection: viewer.connection().clone(),
            viewer: Some(viewer),
            tailer: Some(tailer),
            attached: true,
            at,
            replay_until,
            last_sent,
            heartbeat: None,
            changes: None,
            cut: None,
            was_cut: false,
            stage: Stage::CatchUp { until, tick: Tick::new(), lag_since: None },
            hand_over: true,
        }
    }
}
