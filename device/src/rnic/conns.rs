//! The guest's connections as `vt3d ctl chaos` sees them: each gets a
//! sequence number when it is established (so "the n-th connection" is
//! the same whichever QP numbers the guest chose), and how it ended is
//! remembered a while (the guest may destroy its QP before anyone looks).

use std::collections::VecDeque;

use vt3_iwarp::toe::FourTuple;

use super::Rnic;
use crate::abi::QpState;

/// Connection ends remembered, the oldest forgotten first: enough for a
/// chaos run's looks every 50 ms, bounded whatever the guest does.
const ENDS_KEPT: usize = 1024;

/// A connection of the guest's, established and not yet ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    /// Its place in the order connections were established (from 1).
    pub seq: u64,
    pub qpn: u32,
    pub tuple: FourTuple,
    pub state: QpState,
}

impl Connection {
    /// Up, as `fault --port` counts it: RTS or CLOSING.
    pub fn live(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Closing)
    }
}

/// How a connection ended: its QP went to ERROR (reset, timeout,
/// TERMINATE), or back to IDLE (an orderly close).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnEnd {
    Error,
    Closed,
}

/// Sequence numbers and recent ends.
#[derive(Debug, Default)]
pub(super) struct ConnLog {
    last_seq: u64,
    ends: VecDeque<(u64, ConnEnd)>,
}

impl ConnLog {
    pub(super) fn next_seq(&mut self) -> u64 {
        self.last_seq += 1;
        self.last_seq
    }

    /// A QP with connection `seq` moved to `to`: ERROR or IDLE end it.
    pub(super) fn record(&mut self, seq: u64, to: QpState) {
        let end = match to {
            QpState::Error => ConnEnd::Error,
            QpState::Idle => ConnEnd::Closed,
            _ => return,
        };
        if self.ends.len() == ENDS_KEPT {
            self.ends.pop_front();
        }
        self.ends.push_back((seq, end));
    }
}

impl Rnic {
    /// Connections established and not ended, in the order they were
    /// established.
    pub fn connections(&self) -> Vec<Connection> {
        let mut all: Vec<Connection> = self
            .qps
            .iter()
            .filter_map(|(qpn, qp)| {
                let seq = qp.established?;
                let tuple = self.qp_info(qpn).and_then(|i| i.tuple).or(qp.tuple)?;
                Some(Connection { seq, qpn, tuple, state: qp.state })
            })
            .collect();
        all.sort_by_key(|c| c.seq);
        all
    }

    /// How connection `seq` ended, if it did recently.
    pub fn connection_end(&self, seq: u64) -> Option<ConnEnd> {
        self.conns.ends.iter().find(|(s, _)| *s == seq).map(|(_, end)| *end)
    }
}
