//! A stream's subscriptions by id: a short vector kept in id order. Most
//! streams have one or two subscriptions; a `BTreeMap` allocated a node of
//! eleven for each stream, and every delivery read it from cold memory.

use crate::agent::subscription::Sub;
use crate::pubsub::SubscriptionId;

/// The subscriptions of one stream, in id order.
#[derive(Default)]
pub(crate) struct Subs(Vec<(SubscriptionId, Sub)>);

impl Subs {
    fn find(&self, id: &SubscriptionId) -> Result<usize, usize> {
        self.0.binary_search_by(|(key, _)| key.cmp(id))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn get_mut(&mut self, id: &SubscriptionId) -> Option<&mut Sub> {
        let at = self.find(id).ok()?;
        Some(&mut self.0[at].1)
    }

    /// The subscription `id`, made by `new` if it is not here yet.
    pub(crate) fn get_or_insert_with(&mut self, id: SubscriptionId, new: impl FnOnce() -> Sub) -> &mut Sub {
        let at = match self.find(&id) {
            Ok(at) => at,
            Err(at) => {
                self.0.insert(at, (id, new()));
                at
            }
        };
        &mut self.0[at].1
    }

    pub(crate) fn remove(&mut self, id: &SubscriptionId) -> Option<Sub> {
        let at = self.find(id).ok()?;
        Some(self.0.remove(at).1)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&SubscriptionId, &Sub)> {
        self.0.iter().map(|(id, sub)| (id, sub))
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &SubscriptionId> {
        self.0.iter().map(|(id, _)| id)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Sub> {
        self.0.iter().map(|(_, sub)| sub)
    }
}
