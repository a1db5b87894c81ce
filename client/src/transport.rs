//! How a unary call travels: the one decision.
//!
//! A unary `Launch` can take three transports, a `LoadKernel` two, tried in
//! a fixed order ([`Transport::LAUNCH`], [`Transport::LOAD`]):
//!
//! 1. [`Transport::Packet`]: one packet each way on the daemon's packet
//!    socket ([`crate::fd_lane`]); Unix sockets only.
//! 2. [`Transport::H2Lane`]: a `Launch` on an HTTP/2 connection of its own,
//!    spoken with `h2` directly ([`crate::lane`]); Unix sockets only.
//! 3. [`Transport::Channel`]: the client's tonic channel, always there.
//!
//! Invariants:
//! - One rule for every step: a call takes the first transport of the
//!   order this client has; it moves on to the next only when the one it
//!   tried cannot have sent it ([`LaneError::NotSent`]: each lane's module
//!   says when that is); whatever comes back after a send (an answer, a
//!   refusal, a broken connection) is the call's outcome. So a call is never
//!   sent twice, and a refusal is the same [`Error`] on every transport.
//! - The channel is the last step and never falls back.
//! - Streams (`LaunchStream`, the lease) and every other RPC take the
//!   channel; the launch ring is a transport of its own, opened by
//!   [`crate::Session::open_ring`].

use ptxd_proto::v1 as pb;
use ptxd_proto::v1::ptxd_client::PtxdClient;
use tonic::transport::Channel;

use crate::error::Error;
use crate::fd_lane::FdLane;
use crate::lane::Lane;

/// A transport a unary call can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// The daemon's packet socket.
    Packet,
    /// The h2 lane (`Launch` only).
    H2Lane,
    /// The client's tonic channel.
    Channel,
}

impl Transport {
    /// The order a unary launch tries.
    pub(crate) const LAUNCH: [Transport; 3] =
        [Transport::Packet, Transport::H2Lane, Transport::Channel];
    /// The order a kernel load tries (the h2 lane speaks only `Launch`).
    pub(crate) const LOAD: [Transport; 2] = [Transport::Packet, Transport::Channel];
}

/// Why a call did not go through a lane (a transport before the channel).
#[derive(Debug)]
pub(crate) enum LaneError {
    /// The daemon cannot have seen the request: try the next transport.
    NotSent,
    /// The call failed; the daemon may have run it.
    Failed(Error),
}

/// The transports one session's unary calls may take.
pub(crate) struct Transports<'s> {
    pub(crate) packet: Option<&'s FdLane>,
    pub(crate) h2_lane: Option<&'s Lane>,
    pub(crate) channel: PtxdClient<Channel>,
}

impl Transports<'_> {
    /// Runs a unary launch (see the module's rule).
    pub(crate) async fn launch(
        mut self,
        request: pb::LaunchRequest,
    ) -> Result<pb::LaunchResponse, Error> {
        for transport in Transport::LAUNCH {
            let tried = match (transport, self.packet, self.h2_lane) {
                (Transport::Packet, Some(lane), _) => lane.launch(&request).await,
                (Transport::H2Lane, _, Some(lane)) => lane.launch(&request).await,
                (Transport::Channel, _, _) => break,
                _ => continue,
            };
            if let Some(outcome) = settled(tried) {
                return outcome;
            }
        }
        Ok(self.channel.launch(request).await?.into_inner())
    }

    /// Runs a kernel load (see the module's rule).
    pub(crate) async fn load(
        mut self,
        request: pb::LoadKernelRequest,
    ) -> Result<pb::LoadKernelResponse, Error> {
        for transport in Transport::LOAD {
            let tried = match (transport, self.packet) {
                (Transport::Packet, Some(lane)) => lane.load(&request).await,
                (Transport::Channel, _) => break,
                _ => continue,
            };
            if let Some(outcome) = settled(tried) {
                return outcome;
            }
        }
        Ok(self.channel.load_kernel(request).await?.into_inner())
    }
}

/// The rule: a lane's outcome is the call's, unless the lane cannot have
/// sent the call (`None`: try the next transport).
fn settled<T>(tried: Result<T, LaneError>) -> Option<Result<T, Error>> {
    match tried {
        Ok(answer) => Some(Ok(answer)),
        Err(LaneError::Failed(error)) => Some(Err(error)),
        Err(LaneError::NotSent) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unsent_call_moves_on_and_the_channel_is_last() {
        assert!(settled::<u8>(Err(LaneError::NotSent)).is_none());
        assert!(matches!(settled(Ok(7u8)), Some(Ok(7))));
        assert!(matches!(
            settled::<u8>(Err(LaneError::Failed(Error::SessionClosed))),
            Some(Err(Error::SessionClosed))
        ));
        assert_eq!(Transport::LAUNCH.last(), Some(&Transport::Channel));
        assert_eq!(Transport::LOAD.last(), Some(&Transport::Channel));
        assert!(!Transport::LOAD.contains(&Transport::H2Lane));
    }
}
