//! Counting a frame's lines, and those sent since the measure began.

/// Lines in `frame`, and those sent at or after `measured` (their `t=`
/// stamps). A frame's lines are in the order they were posted, so their
/// stamps never fall: when the first is measured, all are, and only it is
/// parsed (the burst sends 50 million lines to the viewers; parsing each
/// stamp made the clients the host's largest load).
pub(super) fn count_measured(frame: &[u8], measured: u64) -> (u64, u64) {
    let stamp = |at: usize| {
        let digits = frame[at + 2..].iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&frame[at + 2..at + 2 + digits]).ok().and_then(|d| d.parse::<u64>().ok())
    };
    let mut stamps = memchr::memmem::find_iter(frame, b"t=");
    let Some(first) = stamps.next() else { return (0, 0) };
    if stamp(first) >= Some(measured) {
        let lines = 1 + stamps.count() as u64;
        return (lines, lines);
    }
    let later = stamps.filter(|at| stamp(*at) >= Some(measured)).count() as u64;
    let lines = memchr::memmem::find_iter(frame, b"t=").count() as u64;
    (lines, later)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_frame_counts_its_lines_and_those_sent_since_the_measure_began() {
        let frame = br#"data: {"logs":"t=5 n=1.0\nt=7 n=1.1\nt=9 n=2.0","replay":false}"#;
        assert_eq!(super::count_measured(frame, 5), (3, 3));
        assert_eq!(super::count_measured(frame, 6), (3, 2));
        assert_eq!(super::count_measured(frame, 10), (3, 0));
        assert_eq!(super::count_measured(b"data: {}", 0), (0, 0));
    }
}
