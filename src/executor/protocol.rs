//! Framing of the internal executor protocol (`ptxd.executor.v1`).
//!
//! Each frame is a 4-byte little-endian length followed by that many bytes of
//! an encoded protobuf message. Both directions share the framing; the front
//! uses the async half, the executor child the blocking half.
//!
//! Invariant: a frame longer than [`MAX_FRAME_BYTES`] is never allocated for;
//! reading one is a protocol error, so a corrupt length cannot make either side
//! allocate without bound.

use std::io::{self, Read, Write};

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The largest frame either side accepts: the largest artifact the front can
/// be configured to accept plus room for the request around it.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// A failure on the executor channel.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("executor channel I/O: {0}")]
    Io(#[from] io::Error),
    #[error("executor channel closed")]
    Closed,
    #[error("executor frame of {0} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    FrameTooLarge(usize),
    #[error("executor frame does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// One complete frame (length prefix and message), to be written whole.
pub fn encode_frame<M: Message>(message: &M) -> Result<Vec<u8>, ProtocolError> {
    let len = message.encoded_len();
    if len > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge(len));
    }
    let mut frame = Vec::with_capacity(4 + len);
    // `len` fits in u32: MAX_FRAME_BYTES is below u32::MAX.
    frame.extend_from_slice(&(len as u32).to_le_bytes());
    message.encode(&mut frame).map_err(|e| {
        ProtocolError::Io(io::Error::other(format!("encoding an executor frame: {e}")))
    })?;
    Ok(frame)
}

fn checked_len(header: [u8; 4]) -> Result<usize, ProtocolError> {
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge(len));
    }
    Ok(len)
}

/// Writes one frame (blocking).
pub fn write_frame<M: Message>(out: &mut impl Write, message: &M) -> Result<(), ProtocolError> {
    out.write_all(&encode_frame(message)?)?;
    out.flush()?;
    Ok(())
}

/// Reads one frame (blocking). A clean end of stream before a header is
/// [`ProtocolError::Closed`].
pub fn read_frame<M: Message + Default>(input: &mut impl Read) -> Result<M, ProtocolError> {
    let mut header = [0u8; 4];
    match input.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ProtocolError::Closed),
        Err(e) => return Err(e.into()),
    }
    let mut body = vec![0u8; checked_len(header)?];
    input.read_exact(&mut body)?;
    Ok(M::decode(body.as_slice())?)
}

/// Writes one frame (async).
pub async fn write_frame_async<M: Message>(
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
    message: &M,
) -> Result<(), ProtocolError> {
    out.write_all(&encode_frame(message)?).await?;
    out.flush().await?;
    Ok(())
}

/// Reads one frame (async). A clean end of stream before a header is
/// [`ProtocolError::Closed`].
pub async fn read_frame_async<M: Message + Default>(
    input: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Result<M, ProtocolError> {
    let mut header = [0u8; 4];
    match input.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ProtocolError::Closed),
        Err(e) => return Err(e.into()),
    }
    let mut body = vec![0u8; checked_len(header)?];
    input.read_exact(&mut body).await?;
    Ok(M::decode(body.as_slice())?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ptxd_proto::executor::{request::Op, Ping, Request};

    #[test]
    fn a_frame_round_trips() {
        let request = Request {
            id: 42,
            op: Some(Op::Ping(Ping {})),
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &request).unwrap();
        let back: Request = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(back, request);
    }

    #[test]
    fn an_oversized_length_is_refused_without_allocating() {
        let frame = [0xff, 0xff, 0xff, 0xff];
        let err = read_frame::<Request>(&mut frame.as_slice()).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge(n) if n == u32::MAX as usize));
    }

    #[test]
    fn end_of_stream_is_closed_and_a_truncated_body_is_io() {
        let err = read_frame::<Request>(&mut [].as_slice()).unwrap_err();
        assert!(matches!(err, ProtocolError::Closed));
        let err = read_frame::<Request>(&mut [8u8, 0, 0, 0, 1].as_slice()).unwrap_err();
        assert!(matches!(err, ProtocolError::Io(_)));
    }
}
