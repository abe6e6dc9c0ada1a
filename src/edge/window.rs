//! A tailer's window: the newest chunks of a run's log, each rendered once
//! as the live frame every viewer shares, bounded by `max_replay_bytes`
//! (the newest chunk is always kept, however large). Viewers read it at
//! their own cursors; what fell out of it comes from the run log store.

use std::collections::VecDeque;

use bytes::Bytes;

use super::frames;

struct Chunk {
    start: u64,
    lines: Vec<String>,
    bytes: usize,
    /// The chunk as a live frame (`replay: false`), shared by every viewer.
    live: Bytes,
    /// The same frame as an HTTP/1.1 chunk (`live` is a slice of it), so a
    /// chunked response writes the bytes shared by every viewer as they are.
    chunked: Bytes,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.start + self.lines.len() as u64
    }
}

/// A chunk's shared live frame and the offsets it covers.
#[derive(Clone, Debug)]
pub(crate) struct LiveFrame {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) frame: Bytes,
    /// `frame` as an HTTP/1.1 chunk.
    pub(crate) chunked: Bytes,
}

/// What a viewer at some offset gets from the window.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// The frame that follows the offset, and the offset after it.
    Frame(Bytes, u64),
    /// The offset fell out of the window: lines up to `until` must come
    /// from the store.
    Behind { until: u64 },
    /// Nothing past the offset yet.
    Head,
}

/// See the module documentation.
pub(crate) struct Window {
    run: String,
    chunks: VecDeque<Chunk>,
    bytes: usize,
    max_bytes: usize,
    /// The offset after the newest line.
    head: u64,
}

impl Window {
    /// An empty window for `run` whose next line is at `head`.
    pub(crate) fn new(run: &str, head: u64, max_bytes: usize) -> Self {
        Self { run: run.to_string(), chunks: VecDeque::new(), bytes: 0, max_bytes, head }
    }

    /// The offset after the newest line.
    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    /// The oldest offset still held.
    pub(crate) fn front(&self) -> u64 {
        self.chunks.front().map_or(self.head, |c| c.start)
    }

    /// Content bytes held.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }

    /// Appends `lines` at the head; returns their content's size. Older
    /// chunks go once the window is over its bound.
    pub(crate) fn push(&mut self, lines: Vec<String>) -> usize {
        let content = lines.join("\n");
        let start = self.head;
        let frame = frames::logs(&self.run, &content, start + lines.len() as u64, false);
        let chunked = frames::chunk(&frame);
        // The frame within its chunk: after the size line, before the CRLF.
        let prefix = chunked.len() - frame.len() - 2;
        let chunk =
            Chunk { start, bytes: content.len(), live: chunked.slice(prefix..prefix + frame.len()), chunked, lines };
        self.head = chunk.end();
        self.bytes += chunk.bytes;
        let bytes = chunk.bytes;
        self.chunks.push_back(chunk);
        while self.bytes > self.max_bytes && self.chunks.len() > 1 {
            let old = self.chunks.pop_front().map_or(0, |c| c.bytes);
            self.bytes -= old;
        }
        bytes
    }

    /// The newest `n` chunks' live frames, oldest first.
    pub(crate) fn newest(&self, n: usize) -> Vec<LiveFrame> {
        let skip = self.chunks.len().saturating_sub(n);
        self.chunks
            .iter()
            .skip(skip)
            .map(|c| LiveFrame { start: c.start, end: c.end(), frame: c.live.clone(), chunked: c.chunked.clone() })
            .collect()
    }

    /// The frame for a viewer that needs line `at`: the shared live frame
    /// when it starts at a chunk at or past `replay_until`, else one
    /// rendered for it (the rest of the chunk, marked replay below
    /// `replay_until`).
    pub(crate) fn read(&self, at: u64, replay_until: u64) -> Read {
        if at >= self.head {
            return Read::Head;
        }
        if at < self.front() {
            return Read::Behind { until: self.front() };
        }
        let index = self.chunks.partition_point(|c| c.end() <= at);
        let Some(chunk) = self.chunks.get(index) else { return Read::Head };
        if at == chunk.start && chunk.start >= replay_until {
            return Read::Frame(chunk.live.clone(), chunk.end());
        }
        let skip = (at - chunk.start) as usize;
        let frame = frames::logs(&self.run, &chunk.lines[skip..].join("\n"), chunk.end(), chunk.start < replay_until);
        Read::Frame(frame, chunk.end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.split('\n').map(str::to_string).collect()
    }

    fn logs(read: Read) -> (String, u64, bool) {
        let Read::Frame(frame, next) = read else { panic!("not a frame: {read:?}") };
        let text = std::str::from_utf8(&frame).unwrap();
        let event: serde_json::Value = serde_json::from_str(text.trim().strip_prefix("data: ").unwrap()).unwrap();
        (event["logs"].as_str().unwrap().to_string(), next, event["replay"].as_bool().unwrap())
    }

    #[test]
    fn viewers_read_at_their_own_offsets_and_share_live_frames() {
        let mut window = Window::new("r", 10, 1_000);
        window.push(lines("a\nb"));
        window.push(lines("c"));
        assert_eq!((window.front(), window.head()), (10, 13));
        assert_eq!(logs(window.read(10, 10)), ("a\nb".into(), 12, false));
        assert_eq!(logs(window.read(11, 10)), ("b".into(), 12, false), "mid-chunk: the rest of it");
        assert_eq!(logs(window.read(10, 13)), ("a\nb".into(), 12, true), "below replay_until: replay");
        let (Read::Frame(shared, _), Read::Frame(again, _)) = (window.read(12, 0), window.read(12, 0)) else {
            panic!("frames")
        };
        assert_eq!(shared.as_ptr(), again.as_ptr(), "the live frame is rendered once");
        let [newest] = &window.newest(1)[..] else { panic!("one chunk") };
        assert_eq!(&newest.chunked[..], &frames::chunk(&newest.frame)[..], "and chunked once, around it");
        assert_eq!(window.read(13, 0), Read::Head);
        assert_eq!(window.read(20, 0), Read::Head);
        assert_eq!(window.read(9, 0), Read::Behind { until: 10 });
    }

    #[test]
    fn the_window_is_bounded_but_keeps_the_newest_chunk() {
        let mut window = Window::new("r", 0, 10);
        window.push(lines("12345"));
        window.push(lines("67890"));
        assert_eq!((window.front(), window.bytes()), (0, 10));
        window.push(lines("a much longer chunk"));
        assert_eq!((window.front(), window.head(), window.bytes()), (2, 3, 19));
        assert_eq!(window.read(1, 0), Read::Behind { until: 2 });
    }
}
