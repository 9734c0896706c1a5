//! A Server-Sent Events reader for response bodies that arrive in arbitrary pieces.

/// One dispatched event: its `event:` name, if any, and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Splits bytes into lines and lines into events, following the WHATWG rules that
/// providers rely on: `\n`, `\r\n` or `\r` line ends, `:` comments, one optional space
/// after the colon, several `data:` lines per event.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds one piece of the body and appends every event it completes to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        self.buffer.extend_from_slice(bytes);
        let mut start = 0;
        let mut position = 0;
        while position < self.buffer.len() {
            match self.buffer[position] {
                b'\n' => {
                    let line = self.buffer[start..position].to_vec();
                    self.line(&line, out);
                    position += 1;
                    start = position;
                }
                b'\r' => {
                    // A `\r` at the end of the piece may be the first half of `\r\n`.
                    if position + 1 == self.buffer.len() {
                        break;
                    }
                    let line = self.buffer[start..position].to_vec();
                    self.line(&line, out);
                    position += if self.buffer[position + 1] == b'\n' {
                        2
                    } else {
                        1
                    };
                    start = position;
                }
                _ => position += 1,
            }
        }
        self.buffer.drain(..start);
    }

    /// Ends the body: a last event without its closing blank line is still dispatched,
    /// because some servers close the connection right after the final `data:` line.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if !self.buffer.is_empty() {
            let rest = std::mem::take(&mut self.buffer);
            let line = rest.strip_suffix(b"\r").unwrap_or(&rest).to_vec();
            self.line(&line, out);
        }
        self.dispatch(out);
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (text.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            // `id:` and `retry:` matter only to browsers that reconnect by themselves.
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if std::mem::take(&mut self.has_data) {
            out.push(SseEvent {
                event,
                data: std::mem::take(&mut self.data),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(body: &str, piece: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for chunk in body.as_bytes().chunks(piece) {
            parser.push(chunk, &mut out);
        }
        parser.finish(&mut out);
        out
    }

    fn event(name: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: name.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn events_parse_the_same_whatever_the_piece_size() {
        let body = ": keep-alive\r\nevent: message_start\r\ndata: {\"a\":1}\r\n\r\ndata:x\rdata: y\r\rdata: é\n\n";
        let expected = vec![
            event(Some("message_start"), "{\"a\":1}"),
            event(None, "x\ny"),
            event(None, "é"),
        ];
        for piece in 1..body.len() {
            assert_eq!(parse_in_pieces(body, piece), expected, "piece size {piece}");
        }
    }

    #[test]
    fn a_blank_line_without_data_dispatches_nothing_and_forgets_the_name() {
        assert_eq!(
            parse_in_pieces("event: ping\n\ndata: 1\n\n", 64),
            vec![event(None, "1")]
        );
    }

    #[test]
    fn a_final_event_without_its_blank_line_is_kept() {
        assert_eq!(
            parse_in_pieces("data: a\n\ndata: [DONE]", 64),
            vec![event(None, "a"), event(None, "[DONE]")]
        );
    }
}
