//! The dashboard's live flows as the model keeps them: the newest of each
//! sandbox, bounded. Below both the model ([`super::state`]), which holds
//! one, and the thread that feeds it ([`super::flows`]).

use std::collections::{BTreeMap, VecDeque};

use super::data::Flow;

/// Flows kept per sandbox: enough to scroll back through in the flow log,
/// few enough that a busy sandbox costs a bounded amount of memory.
pub const KEEP: usize = 200;

/// The newest flows of each sandbox, at most [`KEEP`] each, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Live {
    by_sandbox: BTreeMap<String, VecDeque<Flow>>,
}

impl Live {
    /// Add flows in the order they were logged, dropping each sandbox's
    /// oldest past [`KEEP`].
    pub fn push(&mut self, flows: impl IntoIterator<Item = Flow>) {
        for f in flows {
            let q = self.by_sandbox.entry(f.sandbox.clone()).or_default();
            if q.len() == KEEP {
                q.pop_front();
            }
            q.push_back(f);
        }
    }

    /// Forget the flows of sandboxes not in `names`: removed sandboxes'
    /// flows would otherwise be kept for the life of the dashboard.
    pub fn retain<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let keep: std::collections::BTreeSet<&str> = names.into_iter().collect();
        self.by_sandbox.retain(|k, _| keep.contains(k.as_str()));
    }

    /// The kept flows of `sandbox`, oldest first.
    pub fn of<'a>(&'a self, sandbox: &str) -> impl DoubleEndedIterator<Item = &'a Flow> + ExactSizeIterator + 'a {
        self.by_sandbox.get(sandbox).map(VecDeque::iter).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(sandbox: &str, host: &str) -> Flow {
        Flow { sandbox: sandbox.into(), host: host.into(), ..Flow::default() }
    }

    #[test]
    fn keeps_the_newest_per_sandbox() {
        let mut live = Live::default();
        live.push((0..KEEP + 5).map(|i| flow("busy", &format!("h{i}"))));
        live.push([flow("quiet", "q0")]);
        let busy: Vec<&str> = live.of("busy").map(|f| f.host.as_str()).collect();
        assert_eq!(busy.len(), KEEP);
        assert_eq!((busy[0], busy[KEEP - 1]), ("h5", "h204"));
        assert_eq!(live.of("quiet").len(), 1, "a busy sandbox does not push out a quiet one");
        assert_eq!(live.of("none").len(), 0);
        live.retain(["quiet"]);
        assert_eq!(live.of("busy").len(), 0);
        assert_eq!(live.of("quiet").len(), 1);
    }
}
