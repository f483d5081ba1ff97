//! Pure planning for the task queue: what a task and a DAG of tasks are,
//! DAG validation and retry back-off.
//!
//! The queue adapters store and claim tasks; what can be decided without I/O
//! lives here. [`plan_dag`] checks a DAG's shape (unique keys, known
//! endpoints, no cycles, size limits) and computes each node's number of
//! parents, which the adapters keep as the remaining-dependencies counter.
//! [`retry_delay`] computes exponential back-off from an attempt number and a
//! jitter value the caller draws (or derives with [`jitter_from_seed`]), so
//! this module never draws random numbers itself.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use crate::{ProductId, Timestamp};

/// Why a task or DAG cannot be enqueued as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidTask(pub String);

/// The queue every task lands on unless told otherwise.
pub const DEFAULT_QUEUE: &str = "default";

/// A task to enqueue.
///
/// ```
/// use std::time::Duration;
///
/// use parlance_core::queue::TaskSpec;
/// use parlance_core::{ProductId, Timestamp};
/// use serde_json::json;
///
/// let at = Timestamp::from_secs(1_767_225_600).expect("a date in range");
/// let task = TaskSpec::new(ProductId::parse("acme")?, "email.send", json!({"to": "ada"}))
///     .queue("mail")
///     .run_at(at)
///     .max_attempts(3)
///     .timeout(Duration::from_secs(30))
///     .dedup_key("welcome:ada");
/// assert_eq!(task.queue, "mail");
/// task.validate()?;
///
/// // A task that could never run is refused before anything is written.
/// let never = TaskSpec::new(ProductId::parse("acme")?, "email.send", json!({})).max_attempts(0);
/// assert!(never.validate().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// The tenant the task works for.
    pub product_id: ProductId,
    /// Which handler runs it.
    pub kind: String,
    /// Which queue it waits on; workers claim from one queue.
    pub queue: String,
    /// The handler's input.
    pub payload: Value,
    /// Lower runs first. Default 0.
    pub priority: i16,
    /// Not before this time; `None` means now.
    pub run_at: Option<Timestamp>,
    /// Attempts before the task is discarded (at least 1). Default 5.
    pub max_attempts: u32,
    /// The hard deadline of one attempt; `None` takes the claim's lease.
    pub timeout: Option<Duration>,
    /// One live task per product and key, and no request lost. A task is
    /// live while it is available (waiting to be claimed) or running.
    /// Enqueueing a task whose key a live task holds adds no task (the
    /// enqueue answers `None` for it), and:
    ///
    /// - when the live task is waiting, nothing changes: the waiting task
    ///   has not started, so it answers the request as it is;
    /// - when it is running, it is marked to run again with this request's
    ///   payload, `queue`, `priority`, `run_at`, `max_attempts` and
    ///   `timeout` (a later request replaces an earlier one's). When the
    ///   task finishes (completed, discarded, cancelled), a fresh task of
    ///   its kind with the key and those fields is enqueued with the
    ///   finish, atomically; when it is requeued instead (a retryable
    ///   failure, an expired lease, a release), it takes them itself, with
    ///   its attempts counted afresh and `run_at` no earlier than the
    ///   requeue's, since it runs again anyway.
    ///
    /// So a request never runs beside the task it was folded into, and
    /// every request made while a task runs is answered by a run that
    /// starts after it. The key names the work: a request folded into a
    /// task of another kind runs as that kind.
    pub dedup_key: Option<String>,
}

impl TaskSpec {
    /// A task of `kind` with defaults: queue `default`, priority 0, now, 5
    /// attempts, the claim's lease as timeout, no dedup key.
    pub fn new(product_id: ProductId, kind: impl Into<String>, payload: Value) -> Self {
        Self {
            product_id,
            kind: kind.into(),
            queue: DEFAULT_QUEUE.to_owned(),
            payload,
            priority: 0,
            run_at: None,
            max_attempts: 5,
            timeout: None,
            dedup_key: None,
        }
    }

    /// On `queue`.
    #[must_use]
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// With `priority` (lower first).
    #[must_use]
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Not before `at`.
    #[must_use]
    pub fn run_at(mut self, at: Timestamp) -> Self {
        self.run_at = Some(at);
        self
    }

    /// At most `n` attempts.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Each attempt must finish within `timeout`.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Deduplicated on `key` while live.
    #[must_use]
    pub fn dedup_key(mut self, key: impl Into<String>) -> Self {
        self.dedup_key = Some(key.into());
        self
    }

    /// Checks what the adapters cannot store.
    ///
    /// # Errors
    ///
    /// An empty kind or queue, or zero attempts.
    pub fn validate(&self) -> Result<(), InvalidTask> {
        if self.kind.is_empty() || self.queue.is_empty() {
            return Err(InvalidTask("task kind and queue must not be empty".into()));
        }
        if self.max_attempts == 0 {
            return Err(InvalidTask("max_attempts must be at least 1".into()));
        }
        Ok(())
    }
}

/// A node of a DAG to enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Unique within the DAG; `[`, `]` and `#` are reserved.
    pub key: String,
    /// Which handler runs it.
    pub kind: String,
    /// The handler's input (parent results arrive in the claimed task's inputs).
    pub payload: Value,
    /// Shown in the run's status labels while the node is queued or running.
    pub label: Option<String>,
    /// Lower runs first.
    pub priority: i16,
    /// Attempts before the node, and so the DAG, fails.
    pub max_attempts: u32,
    /// The hard deadline of one attempt; `None` takes the claim's lease.
    pub timeout: Option<Duration>,
    /// Makes this node a dynamic fan-out: see [`MapSpec`].
    pub map: Option<MapSpec>,
}

impl NodeSpec {
    /// A node with defaults: no label, priority 0, 5 attempts, no map.
    pub fn new(key: impl Into<String>, kind: impl Into<String>, payload: Value) -> Self {
        Self {
            key: key.into(),
            kind: kind.into(),
            payload,
            label: None,
            priority: 0,
            max_attempts: 5,
            timeout: None,
            map: None,
        }
    }

    /// With a progress label.
    #[must_use]
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// At most `n` attempts.
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Each attempt must finish within `timeout`.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// A dynamic fan-out over the list this node returns.
    #[must_use]
    pub fn map(mut self, map: MapSpec) -> Self {
        self.map = Some(map);
        self
    }
}

/// Dynamic fan-out: the node's own task must return a JSON array; when it
/// completes, the queue adds one node per element (`key[i]`, running
/// `kind` with `payload` and the element as its only input) and one combine
/// node (`key#combine`) whose result is the list of the element results in
/// order. The map node's children wait for the combine node instead, and
/// `total` grows by the number of elements plus one.
#[derive(Debug, Clone, PartialEq)]
pub struct MapSpec {
    /// The handler for each element.
    pub kind: String,
    /// The payload of each element's task.
    pub payload: Value,
    /// The label of the element nodes.
    pub label: Option<String>,
}

/// A DAG of tasks to enqueue in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct DagSpec {
    /// The tenant.
    pub product_id: ProductId,
    /// The queue every node's task waits on.
    pub queue: String,
    /// The nodes, in a stable order (results are listed in it).
    pub nodes: Vec<NodeSpec>,
    /// `(parent key, child key)`: the child runs once every parent has
    /// completed and receives their results in this declared order.
    pub edges: Vec<(String, String)>,
}

impl DagSpec {
    /// An empty DAG on the default queue.
    pub fn new(product_id: ProductId) -> Self {
        Self {
            product_id,
            queue: DEFAULT_QUEUE.to_owned(),
            nodes: Vec::new(),
            edges: Vec::new(),
        }
    }

    /// Adds a node.
    #[must_use]
    pub fn node(mut self, node: NodeSpec) -> Self {
        self.nodes.push(node);
        self
    }

    /// Adds an edge: `child` waits for `parent`.
    #[must_use]
    pub fn edge(mut self, parent: impl Into<String>, child: impl Into<String>) -> Self {
        self.edges.push((parent.into(), child.into()));
        self
    }

    /// Checks the shape against `limits` and the nodes' own fields.
    ///
    /// # Errors
    ///
    /// The problem, named.
    pub fn plan(&self, limits: &DagLimits) -> Result<DagPlan, InvalidTask> {
        if self.queue.is_empty() {
            return Err(InvalidTask("dag queue must not be empty".into()));
        }
        for n in &self.nodes {
            if n.kind.is_empty() || n.map.as_ref().is_some_and(|m| m.kind.is_empty()) {
                return Err(InvalidTask(format!("node {:?} has an empty kind", n.key)));
            }
            if n.max_attempts == 0 {
                return Err(InvalidTask(format!(
                    "node {:?} needs max_attempts of at least 1",
                    n.key
                )));
            }
        }
        let keys: Vec<&str> = self.nodes.iter().map(|n| n.key.as_str()).collect();
        let edges: Vec<(&str, &str)> = self
            .edges
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        plan_dag(&keys, &edges, limits).map_err(|e| InvalidTask(format!("dag rejected: {e}")))
    }
}

/// Limits on the size of one DAG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DagLimits {
    /// Most nodes declared up front (a map may add more at run time).
    pub max_nodes: usize,
    /// Most edges declared up front.
    pub max_edges: usize,
    /// Longest node key, in bytes.
    pub max_key_len: usize,
}

impl Default for DagLimits {
    fn default() -> Self {
        Self {
            max_nodes: 1_000,
            max_edges: 10_000,
            max_key_len: 128,
        }
    }
}

/// Why a DAG was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DagError {
    /// No nodes at all.
    #[error("a dag needs at least one node")]
    Empty,
    /// More nodes than the limit.
    #[error("dag has {count} nodes, at most {max} are allowed")]
    TooManyNodes {
        /// Nodes declared.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More edges than the limit.
    #[error("dag has {count} edges, at most {max} are allowed")]
    TooManyEdges {
        /// Edges declared.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A key is empty, too long, or uses a character reserved for the nodes
    /// a map adds at run time (`[`, `]`, `#`).
    #[error("node key {key:?} is not valid: {reason}")]
    BadKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two nodes share a key.
    #[error("node key {0:?} is used twice")]
    DuplicateKey(String),
    /// An edge names a node that does not exist.
    #[error("edge {parent:?} -> {child:?} names unknown node {unknown:?}")]
    UnknownNode {
        /// The edge's parent key.
        parent: String,
        /// The edge's child key.
        child: String,
        /// The key that is not a node.
        unknown: String,
    },
    /// The same edge twice.
    #[error("edge {parent:?} -> {child:?} is declared twice")]
    DuplicateEdge {
        /// The edge's parent key.
        parent: String,
        /// The edge's child key.
        child: String,
    },
    /// The edges form a cycle (a self-loop included).
    #[error("dag has a cycle through {0:?}")]
    Cycle(Vec<String>),
}

/// A validated DAG, by node index (the order the nodes were declared in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DagPlan {
    /// For each node, how many parents it waits for.
    pub remaining_deps: Vec<u32>,
    /// Edges as `(parent, child, position)`, where `position` orders a
    /// child's parents as the edges were declared (the order its inputs
    /// arrive in).
    pub edges: Vec<(usize, usize, u32)>,
    /// Nodes with no parent: runnable as soon as the DAG is enqueued.
    pub roots: Vec<usize>,
}

/// Checks a DAG given its node keys and its edges `(parent, child)`.
///
/// ```
/// use parlance_core::queue::{DagError, DagLimits, plan_dag};
///
/// let limits = DagLimits::default();
/// let keys = ["fetch", "summarize", "notify"];
/// let plan = plan_dag(&keys, &[("fetch", "summarize"), ("summarize", "notify")], &limits)?;
/// assert_eq!(plan.roots, [0]); // `fetch` runs first
/// assert_eq!(plan.remaining_deps, [0, 1, 1]);
///
/// let cycle = plan_dag(&["a", "b"], &[("a", "b"), ("b", "a")], &limits);
/// assert!(matches!(cycle, Err(DagError::Cycle(_))));
/// # Ok::<(), DagError>(())
/// ```
///
/// # Errors
///
/// The first problem found, checked in this order: size, keys, edges, cycles.
pub fn plan_dag(
    keys: &[&str],
    edges: &[(&str, &str)],
    limits: &DagLimits,
) -> Result<DagPlan, DagError> {
    if keys.is_empty() {
        return Err(DagError::Empty);
    }
    if keys.len() > limits.max_nodes {
        return Err(DagError::TooManyNodes {
            count: keys.len(),
            max: limits.max_nodes,
        });
    }
    if edges.len() > limits.max_edges {
        return Err(DagError::TooManyEdges {
            count: edges.len(),
            max: limits.max_edges,
        });
    }
    let mut index = HashMap::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        check_key(key, limits)?;
        if index.insert(*key, i).is_some() {
            return Err(DagError::DuplicateKey((*key).to_owned()));
        }
    }
    let mut remaining = vec![0u32; keys.len()];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); keys.len()];
    let mut planned = Vec::with_capacity(edges.len());
    let mut seen = std::collections::HashSet::with_capacity(edges.len());
    for (parent, child) in edges {
        let lookup = |k: &str| {
            index.get(k).copied().ok_or_else(|| DagError::UnknownNode {
                parent: (*parent).to_owned(),
                child: (*child).to_owned(),
                unknown: k.to_owned(),
            })
        };
        let (p, c) = (lookup(parent)?, lookup(child)?);
        if p == c {
            return Err(DagError::Cycle(vec![(*parent).to_owned()]));
        }
        if !seen.insert((p, c)) {
            return Err(DagError::DuplicateEdge {
                parent: (*parent).to_owned(),
                child: (*child).to_owned(),
            });
        }
        planned.push((p, c, remaining[c]));
        remaining[c] += 1;
        children[p].push(c);
    }
    // Kahn's algorithm: whatever is never freed lies on or behind a cycle.
    let mut left = remaining.clone();
    let mut ready: Vec<usize> = (0..keys.len()).filter(|&i| left[i] == 0).collect();
    let roots = ready.clone();
    let mut visited = 0;
    while let Some(n) = ready.pop() {
        visited += 1;
        for &c in &children[n] {
            left[c] -= 1;
            if left[c] == 0 {
                ready.push(c);
            }
        }
    }
    if visited < keys.len() {
        let stuck = (0..keys.len())
            .filter(|&i| left[i] > 0)
            .map(|i| keys[i].to_owned())
            .collect();
        return Err(DagError::Cycle(stuck));
    }
    Ok(DagPlan {
        remaining_deps: remaining,
        edges: planned,
        roots,
    })
}

fn check_key(key: &str, limits: &DagLimits) -> Result<(), DagError> {
    let bad = |reason| {
        Err(DagError::BadKey {
            key: key.to_owned(),
            reason,
        })
    };
    if key.is_empty() {
        return bad("empty");
    }
    if key.len() > limits.max_key_len {
        return bad("too long");
    }
    if key
        .chars()
        .any(|c| c.is_control() || matches!(c, '[' | ']' | '#'))
    {
        return bad("control characters and `[`, `]`, `#` are reserved");
    }
    Ok(())
}

/// The key of element `index` of map node `map_key`, added at run time.
pub fn map_element_key(map_key: &str, index: usize) -> String {
    format!("{map_key}[{index}]")
}

/// The key of the node that collects a map's results, added at run time.
pub fn map_combine_key(map_key: &str) -> String {
    format!("{map_key}#combine")
}

/// Exponential back-off between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failed attempt, before jitter.
    pub base: Duration,
    /// The largest delay, before jitter.
    pub cap: Duration,
}

impl Default for Backoff {
    /// 2 s doubling per attempt, capped at 10 minutes.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(600),
        }
    }
}

/// The wait before retrying after failed attempt number `attempt` (1 for the
/// first): `min(cap, base * 2^(attempt - 1))` scaled by `0.5 + jitter / 2`,
/// so the delay falls uniformly in its upper half when `jitter` is uniform
/// in `[0, 1)`. `jitter` outside that range is clamped.
pub fn retry_delay(attempt: u32, backoff: &Backoff, jitter: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let raw = backoff
        .base
        .checked_mul(1u32 << exp)
        .unwrap_or(backoff.cap)
        .min(backoff.cap);
    let j = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    raw.mul_f64(0.5 + j / 2.0)
}

/// A value in `[0, 1)` derived from `seed` by SplitMix64: callers that have
/// no random source pass something unique per attempt (a fencing token), so
/// tasks that failed together do not retry together.
pub fn jitter_from_seed(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    // The top 53 bits as a fraction: exact in an f64.
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// What to do with a task whose attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Run it again after the delay.
    RetryAfter(Duration),
    /// Give up: the task becomes `discarded` (the dead-letter state).
    Discard,
}

/// Decides whether failed attempt `attempt` of at most `max_attempts` is
/// retried: only when the error is retryable and attempts remain.
pub fn decide_retry(
    attempt: u32,
    max_attempts: u32,
    retryable: bool,
    backoff: &Backoff,
    jitter: f64,
) -> RetryDecision {
    if retryable && attempt < max_attempts {
        RetryDecision::RetryAfter(retry_delay(attempt, backoff, jitter))
    } else {
        RetryDecision::Discard
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plan(keys: &[&str], edges: &[(&str, &str)]) -> Result<DagPlan, DagError> {
        plan_dag(keys, edges, &DagLimits::default())
    }

    #[test]
    fn fan_out_fan_in_counts_parents_in_declared_order() {
        let p = plan(
            &["a", "b", "c", "d"],
            &[("a", "b"), ("a", "c"), ("c", "d"), ("b", "d")],
        )
        .unwrap();
        assert_eq!(p.remaining_deps, [0, 1, 1, 2]);
        assert_eq!(p.roots, [0]);
        assert_eq!(p.edges, [(0, 1, 0), (0, 2, 0), (2, 3, 0), (1, 3, 1)]);
    }

    #[test]
    fn rejects_bad_shapes() {
        assert_eq!(plan(&[], &[]), Err(DagError::Empty));
        assert_eq!(
            plan(&["a", "a"], &[]),
            Err(DagError::DuplicateKey("a".into()))
        );
        assert!(matches!(
            plan(&["a"], &[("a", "z")]),
            Err(DagError::UnknownNode { unknown, .. }) if unknown == "z"
        ));
        assert_eq!(
            plan(&["a"], &[("a", "a")]),
            Err(DagError::Cycle(vec!["a".into()]))
        );
        assert_eq!(
            plan(&["a", "b", "c"], &[("a", "b"), ("b", "c"), ("c", "b")]),
            Err(DagError::Cycle(vec!["b".into(), "c".into()]))
        );
        assert!(matches!(
            plan(&["a", "b"], &[("a", "b"), ("a", "b")]),
            Err(DagError::DuplicateEdge { .. })
        ));
        assert!(matches!(plan(&["x[0]"], &[]), Err(DagError::BadKey { .. })));
        let small = DagLimits {
            max_nodes: 2,
            max_edges: 1,
            max_key_len: 3,
        };
        assert!(matches!(
            plan_dag(&["a", "b", "c"], &[], &small),
            Err(DagError::TooManyNodes { count: 3, max: 2 })
        ));
        assert!(matches!(
            plan_dag(&["a", "b"], &[("a", "b"), ("b", "a")], &small),
            Err(DagError::TooManyEdges { count: 2, max: 1 })
        ));
        assert!(matches!(
            plan_dag(&["long"], &[], &small),
            Err(DagError::BadKey { .. })
        ));
    }

    #[test]
    fn back_off_doubles_caps_and_jitters() {
        let b = Backoff::default();
        assert_eq!(retry_delay(1, &b, 1.0), Duration::from_secs(2));
        assert_eq!(retry_delay(3, &b, 1.0), Duration::from_secs(8));
        assert_eq!(retry_delay(3, &b, 0.0), Duration::from_secs(4));
        assert_eq!(retry_delay(40, &b, 1.0), Duration::from_secs(600));
        assert_eq!(retry_delay(2, &b, f64::NAN), Duration::from_secs(2));
        assert_eq!(
            decide_retry(2, 3, true, &b, 1.0),
            RetryDecision::RetryAfter(Duration::from_secs(4))
        );
        assert_eq!(decide_retry(3, 3, true, &b, 1.0), RetryDecision::Discard);
        assert_eq!(decide_retry(1, 3, false, &b, 1.0), RetryDecision::Discard);
    }

    proptest! {
        #[test]
        fn jitter_is_a_fraction(seed in any::<u64>()) {
            let j = jitter_from_seed(seed);
            prop_assert!((0.0..1.0).contains(&j));
        }

        #[test]
        fn accepted_plans_are_acyclic_and_counted(
            n in 1usize..12,
            raw in proptest::collection::vec((0usize..12, 0usize..12), 0..30),
        ) {
            let keys: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let edges: Vec<(&str, &str)> = raw
                .iter()
                .filter(|(a, b)| *a < n && *b < n)
                .map(|(a, b)| (refs[*a], refs[*b]))
                .collect();
            if let Ok(p) = plan(&refs, &edges) {
                let total: u32 = p.remaining_deps.iter().sum();
                prop_assert_eq!(total as usize, edges.len());
                prop_assert!(!p.roots.is_empty());
                // Running the plan frees every node exactly once.
                let mut left = p.remaining_deps.clone();
                let mut ready = p.roots.clone();
                let mut done = 0;
                while let Some(x) = ready.pop() {
                    done += 1;
                    for &(a, b, _) in &p.edges {
                        if a == x {
                            left[b] -= 1;
                            if left[b] == 0 { ready.push(b); }
                        }
                    }
                }
                prop_assert_eq!(done, n);
            }
        }
    }
}
