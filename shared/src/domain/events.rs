//! A task's event stream, as the worker writes it and `GET /v1/tasks/{id}/events` reads it: what a
//! run says while it runs ([`RunEvent`]), the ids that order it ([`EventId`]), and the state a
//! reader shows before the first event. Pure.
//!
//! The stream is a view of the runs, never the record: the record's fenced final write decides the
//! answer, and the reader ends the stream with that record's `result` or `error`. Each event names
//! the run (its claim's fence) that wrote it, so a run taken over after a crash starts a new
//! segment the client can tell apart. A run whose text must start again (a stream the provider
//! cut, then retried) says so with [`RunEvent::Restart`] before any new text: a client that appends
//! deltas never shows a character twice.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How long a task's stream is kept after its last event: a late or reconnecting reader finds the
/// result in the record anyway, so the stream only has to outlive a reconnect.
pub const STREAM_TTL_SECS: u64 = 3600;

/// Most events one task's stream keeps (the oldest go first, as Redis's `MAXLEN ~` trims).
pub const STREAM_MAX_EVENTS: usize = 10_000;

/// What a run reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    /// The run started (its claim's fence): a new segment.
    Running {
        /// The run.
        run: u64,
    },
    /// The next text of the run's answer.
    Delta {
        /// The run.
        run: u64,
        /// The text, appended to what the segment said so far.
        text: String,
    },
    /// What the run said so far is void: its answer starts again (a cut stream retried, or the
    /// next route called).
    Restart {
        /// The run.
        run: u64,
        /// Why.
        reason: String,
    },
    /// The run's call failed before any text, and is made again (a 429 or a 5xx before the first
    /// byte, the next route): nothing is void.
    Retrying {
        /// The run.
        run: u64,
        /// Why.
        reason: String,
    },
    /// The run ended without an answer here: it is retried later, or its lease or its client's
    /// cancel stopped it. The final `result` or `error` comes from the record.
    Stopped {
        /// The run.
        run: u64,
        /// Why.
        reason: String,
    },
}

impl RunEvent {
    /// The run (its claim's fence) that wrote it.
    pub fn run(&self) -> u64 {
        match self {
            Self::Running { run }
            | Self::Delta { run, .. }
            | Self::Restart { run, .. }
            | Self::Retrying { run, .. }
            | Self::Stopped { run, .. } => *run,
        }
    }

    /// The SSE event name it is sent under.
    pub fn sse_name(&self) -> &'static str {
        match self {
            Self::Delta { .. } => "delta",
            _ => "status",
        }
    }

    /// The SSE data: a JSON object naming the run and, for a status, its state.
    pub fn sse_data(&self) -> serde_json::Value {
        match self {
            Self::Running { run } => serde_json::json!({"state": "running", "run": run}),
            Self::Delta { run, text } => serde_json::json!({"run": run, "text": text}),
            Self::Restart { run, reason } => {
                serde_json::json!({"state": "restarting", "run": run, "reason": reason})
            }
            Self::Retrying { run, reason } => {
                serde_json::json!({"state": "retrying", "run": run, "reason": reason})
            }
            Self::Stopped { run, reason } => {
                serde_json::json!({"state": "stopped", "run": run, "reason": reason})
            }
        }
    }

    /// Appends `next` to this event when both are text of the same run (a publisher sends several
    /// small deltas as one); `next` back otherwise.
    pub fn merge(&mut self, next: RunEvent) -> Option<RunEvent> {
        match (self, next) {
            (Self::Delta { run, text }, Self::Delta { run: r, text: t }) if *run == r => {
                text.push_str(&t);
                None
            }
            (_, next) => Some(next),
        }
    }
}

/// An event's place in its stream: `<ms>-<seq>`, as Redis stream ids are, ordered by both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId {
    /// Milliseconds (Unix, of the log that wrote it).
    pub ms: u64,
    /// Sequence within the millisecond.
    pub seq: u64,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Why a `Last-Event-ID` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an event id is two decimal numbers of 1 to 19 digits joined by '-', as in 1733400000000-0")]
pub struct BadEventId;

impl FromStr for EventId {
    type Err = BadEventId;
    fn from_str(s: &str) -> Result<Self, BadEventId> {
        let (ms, seq) = s.split_once('-').ok_or(BadEventId)?;
        let number = |p: &str| {
            // 19 digits always fit a u64, so the form alone says whether an id is valid.
            if p.is_empty() || p.len() > 19 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(BadEventId);
            }
            p.parse().map_err(|_| BadEventId)
        };
        Ok(Self { ms: number(ms)?, seq: number(seq)? })
    }
}

impl EventId {
    /// The id after `last` for an event written at `now_ms`: later by the clock, or the next in
    /// `last`'s millisecond when the clock has not moved past it.
    pub fn next(last: Option<EventId>, now_ms: u64) -> EventId {
        match last {
            Some(l) if l.ms >= now_ms => EventId { ms: l.ms, seq: l.seq + 1 },
            _ => EventId { ms: now_ms, seq: 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_back_as_written_and_order_by_time_then_sequence() {
        let id = EventId { ms: 1_733_400_000_000, seq: 7 };
        assert_eq!(id.to_string().parse::<EventId>(), Ok(id));
        assert!(EventId { ms: 1, seq: 9 } < EventId { ms: 2, seq: 0 });
        for bad in ["", "1", "1-", "-1", "a-1", "1-2-3", "+1-2", " 1-2", "1-99999999999999999999", "1-2\n"] {
            assert_eq!(bad.parse::<EventId>(), Err(BadEventId), "{bad:?}");
        }
    }

    #[test]
    fn the_next_id_never_goes_back_when_the_clock_does() {
        assert_eq!(EventId::next(None, 5), EventId { ms: 5, seq: 0 });
        assert_eq!(EventId::next(Some(EventId { ms: 5, seq: 0 }), 5), EventId { ms: 5, seq: 1 });
        assert_eq!(EventId::next(Some(EventId { ms: 9, seq: 3 }), 5), EventId { ms: 9, seq: 4 });
        assert_eq!(EventId::next(Some(EventId { ms: 9, seq: 3 }), 10), EventId { ms: 10, seq: 0 });
    }

    #[test]
    fn only_text_of_one_run_merges() {
        let mut a = RunEvent::Delta { run: 1, text: "ab".into() };
        assert_eq!(a.merge(RunEvent::Delta { run: 1, text: "c".into() }), None);
        assert_eq!(a, RunEvent::Delta { run: 1, text: "abc".into() });
        let other = RunEvent::Delta { run: 2, text: "x".into() };
        assert_eq!(a.merge(other.clone()), Some(other));
        let stop = RunEvent::Stopped { run: 1, reason: "lease lost".into() };
        assert_eq!(a.merge(stop.clone()), Some(stop));
    }

    #[test]
    fn a_status_names_its_state_and_run() {
        let e = RunEvent::Restart { run: 3, reason: "stream cut".into() };
        assert_eq!(
            (e.sse_name(), e.sse_data()["state"].as_str(), e.run()),
            ("status", Some("restarting"), 3)
        );
        assert_eq!(RunEvent::Delta { run: 3, text: "x".into() }.sse_name(), "delta");
    }
}
