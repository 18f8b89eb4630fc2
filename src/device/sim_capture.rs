//! Stream capture on the sim backend: a model of the CUDA rules the
//! runtime must respect, so that its capture rules run in CI.
//!
//! Contract (what the sim device does, after CUDA):
//! - `begin` makes a stream capture (a new capture id); `end` on that same
//!   stream ends the capture for every stream in it and returns a graph
//!   token, or fails if the capture was invalidated.
//! - Work queued on a capturing stream is not run: it belongs to the graph
//!   (the sim does not model graph launches). An event recorded there is a
//!   *captured* event.
//! - A wait by a capturing stream on an event of its own capture is a graph
//!   edge. A wait by a non-capturing stream on a captured event makes that
//!   stream join the capture (a fork). A wait by a capturing stream on an
//!   event recorded outside its capture crosses the capture boundary: the
//!   call fails and the capture is invalidated (`cudaErrorStreamCaptureIsolation`).
//! - Querying or synchronising a captured event fails
//!   (`cudaErrorCapturedEvent`); synchronising a capturing stream, or a
//!   stream-ordered allocation or free on it, fails and invalidates the
//!   capture (the sim models no allocation nodes; xlog never makes them).

use std::collections::HashMap;

use super::{DeviceResult, RawEvent, RawStream};
use crate::error::DeviceError;

#[derive(Default)]
pub(crate) struct SimCaptures {
    next_id: u64,
    /// The capture each capturing stream takes part in.
    of_stream: HashMap<RawStream, u64>,
    /// Capture id → (the stream it was begun on, invalidated).
    captures: HashMap<u64, (RawStream, bool)>,
    /// Events whose latest record was inside a capture → that capture.
    captured_events: HashMap<RawEvent, u64>,
}

/// What a wait on an event means under the rules above.
pub(crate) enum WaitKind {
    /// An ordinary wait, run by the stream.
    Run,
    /// A graph edge or a fork: nothing runs now.
    Captured,
}

impl SimCaptures {
    pub fn capture_of(&self, stream: RawStream) -> Option<u64> {
        self.of_stream.get(&stream).copied()
    }

    pub fn begin(&mut self, stream: RawStream) -> DeviceResult<()> {
        if let Some(c) = self.capture_of(stream) {
            return Err(DeviceError::Invalid(format!("sim stream {stream} is already capturing (capture {c})")));
        }
        self.next_id += 1;
        let id = self.next_id;
        self.of_stream.insert(stream, id);
        self.captures.insert(id, (stream, false));
        Ok(())
    }

    pub fn end(&mut self, stream: RawStream) -> DeviceResult<u64> {
        let c = self
            .capture_of(stream)
            .ok_or_else(|| DeviceError::Invalid(format!("sim stream {stream} is not capturing")))?;
        let (origin, invalidated) = self.captures[&c];
        if origin != stream {
            return Err(DeviceError::Invalid(format!(
                "capture {c} was begun on sim stream {origin}, not on stream {stream}"
            )));
        }
        self.of_stream.retain(|_, id| *id != c);
        self.captures.remove(&c);
        if invalidated {
            return Err(DeviceError::Invalid(format!("sim capture {c} was invalidated")));
        }
        Ok(0x6000_0000_0000 | c)
    }

    /// Whether `stream` captures; if so, that capture is invalidated by the
    /// operation `what`, which fails.
    pub fn refuse_if_capturing(&mut self, stream: RawStream, what: &str) -> DeviceResult<()> {
        match self.capture_of(stream) {
            None => Ok(()),
            Some(c) => {
                self.invalidate(c);
                Err(DeviceError::Invalid(format!("sim: {what} on stream {stream} while it captures (capture {c} is now invalidated)")))
            }
        }
    }

    fn invalidate(&mut self, c: u64) {
        if let Some(state) = self.captures.get_mut(&c) {
            state.1 = true;
        }
    }

    /// An event recorded on `stream`: captured if the stream captures.
    /// Returns whether the record is captured (then nothing runs).
    pub fn record(&mut self, event: RawEvent, stream: RawStream) -> bool {
        match self.capture_of(stream) {
            Some(c) => {
                self.captured_events.insert(event, c);
                true
            }
            None => {
                self.captured_events.remove(&event);
                false
            }
        }
    }

    pub fn wait(&mut self, stream: RawStream, event: RawEvent) -> DeviceResult<WaitKind> {
        let waiter = self.capture_of(stream);
        let recorded_in = self.captured_events.get(&event).copied();
        match (waiter, recorded_in) {
            (None, None) => Ok(WaitKind::Run),
            (Some(c), Some(e)) if c == e => Ok(WaitKind::Captured),
            (None, Some(e)) => {
                self.of_stream.insert(stream, e);
                Ok(WaitKind::Captured)
            }
            (Some(c), other) => {
                self.invalidate(c);
                Err(DeviceError::Invalid(format!(
                    "sim: capturing stream {stream} (capture {c}) waited on event {event:#x} recorded {}: \
                     a dependency across the capture boundary (capture {c} is now invalidated)",
                    match other {
                        Some(e) => format!("in capture {e}"),
                        None => "outside any capture".to_string(),
                    }
                )))
            }
        }
    }

    /// Queries and host waits on a captured event fail.
    pub fn check_not_captured(&self, event: RawEvent, what: &str) -> DeviceResult<()> {
        match self.captured_events.get(&event) {
            None => Ok(()),
            Some(c) => Err(DeviceError::Invalid(format!("sim: {what} of event {event:#x}, last recorded in capture {c}"))),
        }
    }
}
