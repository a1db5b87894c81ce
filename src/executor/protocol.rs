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

/// Frames arriving in pieces on a non-blocking stream: bytes go in as
/// they are read ([`FrameBuffer::spare`], then [`FrameBuffer::filled`]),
/// whole frames come out ([`FrameBuffer::next_frame`]).
///
/// Invariant: `start <= end <= bytes.len()`; `bytes[start..end]` are the
/// bytes read and not yet decoded. The buffer grows to hold the frame being
/// received (never past [`MAX_FRAME_BYTES`] plus its header: a longer
/// length is an error before anything is allocated) and shrinks back to
/// its first size once emptied.
#[derive(Debug)]
pub struct FrameBuffer {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
    initial: usize,
}

impl FrameBuffer {
    pub fn with_capacity(capacity: usize) -> FrameBuffer {
        let initial = capacity.max(4);
        FrameBuffer {
            bytes: vec![0; initial],
            start: 0,
            end: 0,
            initial,
        }
    }

    /// The next whole frame, decoded; `None` while less than one is held.
    /// An error (a length over the limit, a frame that does not decode)
    /// leaves the stream unusable: the caller ends it.
    pub fn next_frame<M: Message + Default>(&mut self) -> Result<Option<M>, ProtocolError> {
        let held = self.bytes.get(self.start..self.end).unwrap_or_default();
        let Some(total) = Self::frame_len(held)? else {
            return Ok(None);
        };
        let Some(frame) = held.get(4..total) else {
            return Ok(None);
        };
        let message = M::decode(frame)?;
        self.start += total;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.bytes.len() > 4 * self.initial {
                self.bytes = vec![0; self.initial];
            }
        }
        Ok(Some(message))
    }

    /// Header plus body of the frame `held` starts with, once its header
    /// is in.
    fn frame_len(held: &[u8]) -> Result<Option<usize>, ProtocolError> {
        let Some(header) = held.first_chunk::<4>() else {
            return Ok(None);
        };
        Ok(Some(4 + checked_len(*header)?))
    }

    /// Where to read the next bytes: never empty, and room for the whole
    /// frame being received.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let held = self.bytes.get(..self.end).unwrap_or_default();
        // An oversized length is refused by `next_frame`; room for its header
        // only is enough until then.
        let needed = Self::frame_len(held).ok().flatten().unwrap_or(4);
        let wanted = needed.max(self.end + 1);
        if self.bytes.len() < wanted {
            self.bytes.resize(wanted.max(self.initial), 0);
        }
        self.bytes.get_mut(self.end..).unwrap_or_default()
    }

    /// `n` bytes were read into [`FrameBuffer::spare`].
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.bytes.len());
    }

    /// True when no byte of a frame is held.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
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

    fn frames(ids: std::ops::Range<u64>) -> Vec<u8> {
        let mut bytes = Vec::new();
        for id in ids {
            write_frame(
                &mut bytes,
                &Request {
                    id,
                    op: Some(Op::Ping(Ping {})),
                },
            )
            .unwrap();
        }
        bytes
    }

    /// Feeds `bytes` through a buffer `chunk` bytes per read, collecting the
    /// ids of the frames that come out.
    fn feed(bytes: &[u8], chunk: usize, capacity: usize) -> Vec<u64> {
        let mut buffer = FrameBuffer::with_capacity(capacity);
        let mut ids = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let spare = buffer.spare();
            assert!(!spare.is_empty());
            let n = chunk.min(spare.len()).min(bytes.len() - at);
            spare[..n].copy_from_slice(&bytes[at..at + n]);
            buffer.filled(n);
            at += n;
            while let Some(request) = buffer.next_frame::<Request>().unwrap() {
                ids.push(request.id);
            }
        }
        assert!(buffer.is_empty());
        ids
    }

    #[test]
    fn frames_come_out_whole_and_in_order_however_the_bytes_are_cut() {
        let bytes = frames(1000..1100);
        let all: Vec<u64> = (1000..1100).collect();
        for chunk in [1, 2, 3, 5, 7, 64, 1000, bytes.len()] {
            for capacity in [4, 9, 64, 1 << 16] {
                assert_eq!(
                    feed(&bytes, chunk, capacity),
                    all,
                    "chunk {chunk}, capacity {capacity}"
                );
            }
        }
    }

    #[test]
    fn a_frame_larger_than_the_buffer_grows_it_and_it_shrinks_back() {
        let big = Request {
            id: 7,
            op: Some(Op::LoadModule(ptxd_proto::executor::LoadModule {
                artifact: vec![0x5a; 100_000],
                ..Default::default()
            })),
        };
        let mut bytes = Vec::new();
        write_frame(&mut bytes, &big).unwrap();
        bytes.extend(frames(8..10));
        let mut buffer = FrameBuffer::with_capacity(64);
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let spare = buffer.spare();
            let n = spare.len().min(bytes.len() - at);
            spare[..n].copy_from_slice(&bytes[at..at + n]);
            buffer.filled(n);
            at += n;
            while let Some(request) = buffer.next_frame::<Request>().unwrap() {
                out.push(request);
            }
        }
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], big);
        assert_eq!((out[1].id, out[2].id), (8, 9));
        assert!(buffer.bytes.len() <= 4 * 64, "the buffer shrank back");
    }

    #[test]
    fn a_length_over_the_limit_is_an_error_before_any_allocation() {
        let mut buffer = FrameBuffer::with_capacity(16);
        let spare = buffer.spare();
        spare[..4].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        buffer.filled(4);
        assert!(matches!(
            buffer.next_frame::<Request>(),
            Err(ProtocolError::FrameTooLarge(n)) if n == u32::MAX as usize
        ));
        assert!(buffer.spare().len() <= 16);
        // A body that does not decode is an error too.
        let mut buffer = FrameBuffer::with_capacity(16);
        let spare = buffer.spare();
        spare[..6].copy_from_slice(&[2, 0, 0, 0, 0xff, 0xff]);
        buffer.filled(6);
        assert!(matches!(
            buffer.next_frame::<Request>(),
            Err(ProtocolError::Decode(_))
        ));
    }
}
