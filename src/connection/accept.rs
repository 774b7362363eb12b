//! The connection caps in Pingora's accept loop: a connection from an
//! address over its cap (or past the total) is closed right after
//! `accept()`, before Pingora spawns its task, so a flood of connections
//! costs an accept and a close each, not a task and its buffers.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use async_trait::async_trait;
use pingora::listeners::ConnectionFilter;

use super::caps::ConnectionCaps;
use crate::server::state::AppState;

/// The address a connection from `peer` counts against under the
/// per-address cap: grouped as limits group it, none for a trusted proxy.
pub(crate) fn counted_as(state: &AppState, peer: Option<IpAddr>) -> Option<IpAddr> {
    peer.and_then(|ip| state.runtime.load().policy.clients.connection_group(ip))
}

pub(crate) struct AcceptFilter {
    caps: Arc<ConnectionCaps>,
    state: Arc<AppState>,
}

impl AcceptFilter {
    pub(crate) fn new(caps: Arc<ConnectionCaps>, state: Arc<AppState>) -> Arc<Self> {
        Arc::new(AcceptFilter { caps, state })
    }
}

impl fmt::Debug for AcceptFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AcceptFilter")
    }
}

#[async_trait]
impl ConnectionFilter for AcceptFilter {
    async fn should_accept(&self, addr: Option<&SocketAddr>) -> bool {
        let peer = addr.map(|a| floodgate_policy::identity::normalize(a.ip()));
        let group = counted_as(&self.state, peer);
        match self.caps.has_room(group) {
            Ok(()) => true,
            Err(reason) => {
                self.caps.metrics.refused_at_accept.inc();
                self.caps.refused(group.or(peer), reason);
                false
            }
        }
    }
}
