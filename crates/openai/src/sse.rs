//! A server-sent-events decoder: bytes in, the `data` of each event out.

/// One event: its `event` name (if any) and its joined `data` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub(crate) event: Option<String>,
    pub(crate) data: String,
}

/// Splits a byte stream into events, whatever the chunk boundaries (lines
/// end in `\n` or `\r\n`; a blank line ends an event; `:` lines are comments).
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

/// Largest line kept in memory; a longer one is a broken stream.
const MAX_LINE: usize = 8 * 1024 * 1024;

impl SseDecoder {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events they complete. `Err` when a line
    /// grows past the limit.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|b| *b == b'\n') {
            let end = start + nl;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            self.line(&line, &mut events);
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_LINE {
            return Err(format!("event stream line longer than {MAX_LINE} bytes"));
        }
        Ok(events)
    }

    /// The event left open when the stream ends without a blank line.
    pub(crate) fn finish(&mut self) -> Option<SseEvent> {
        if !self.buf.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned();
            let mut sink = Vec::new();
            self.line(line.trim_end_matches('\r'), &mut sink);
            if let Some(e) = sink.pop() {
                return Some(e);
            }
        }
        self.take()
    }

    fn take(&mut self) -> Option<SseEvent> {
        if self.data.is_empty() {
            self.event = None;
            return None;
        }
        Some(SseEvent {
            event: self.event.take(),
            data: std::mem::take(&mut self.data).join("\n"),
        })
    }

    fn line(&mut self, line: &str, events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            events.extend(self.take());
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => self.data.push(value.to_owned()),
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_survive_any_chunking() {
        let text = ": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: error\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
        for size in 1..text.len() {
            let mut d = SseDecoder::new();
            let mut got = Vec::new();
            for chunk in text.as_bytes().chunks(size) {
                got.extend(d.push(chunk).unwrap());
            }
            assert_eq!(d.finish(), None);
            assert_eq!(
                got,
                vec![
                    SseEvent {
                        event: None,
                        data: "{\"a\":1}".into()
                    },
                    SseEvent {
                        event: Some("error".into()),
                        data: "x\ny".into()
                    },
                    SseEvent {
                        event: None,
                        data: "[DONE]".into()
                    },
                ],
                "chunk size {size}"
            );
        }
    }

    #[test]
    fn an_unterminated_last_event_is_flushed() {
        let mut d = SseDecoder::new();
        assert!(d.push(b"data: tail").unwrap().is_empty());
        assert_eq!(d.finish().unwrap().data, "tail");
    }
}
