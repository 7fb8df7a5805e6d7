//! What a tool returns stays at a size a model can use (`hutch mcp --max-output-bytes`,
//! default [`DEFAULT_MAX_OUTPUT_BYTES`]).
//!
//! Text longer than its budget keeps its head and its tail, and the cut is marked in the
//! text with the byte counts and where the rest is: a command's whole stdout or stderr is
//! written to `/tmp/hutch-mcp/<n>.stdout` (`.stderr`) inside the sandbox first, and
//! `read_file` reads any byte range of a file (`offset`, `length`).

/// The default cap on what one tool call returns, in bytes.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 20_000;

/// The smallest cap `--max-output-bytes` takes (room for the marker and some text).
pub const MIN_MAX_OUTPUT_BYTES: usize = 1_000;

/// Where the whole output of cut commands is written inside the sandbox.
pub const SAVED_OUTPUT_DIR: &str = "/tmp/hutch-mcp";

/// `text` cut to at most `budget` bytes, marker included: the first and last halves, and
/// between them `marker` (given the number of bytes left out, the head's length and the
/// tail's start offset).
pub fn cut(text: &str, budget: usize, marker: impl Fn(usize, usize, usize) -> String) -> String {
    if text.len() <= budget {
        return text.to_string();
    }
    // The marker's own length, with numbers as long as they can get.
    let room = budget.saturating_sub(marker(text.len(), text.len(), text.len()).len());
    let half = room / 2;
    let mut head_end = half;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - (room - half);
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let omitted = tail_start - head_end;
    format!(
        "{}{}{}",
        &text[..head_end],
        marker(omitted, head_end, tail_start),
        &text[tail_start..]
    )
}

/// The budgets of two streams sharing `total` bytes: each gets what it needs if both fit,
/// a small one keeps all it has, and two large ones split evenly.
pub fn split_budget(a: usize, b: usize, total: usize) -> (usize, usize) {
    if a + b <= total {
        return (a, b);
    }
    let half = total / 2;
    if a <= half {
        (a, total - a)
    } else if b <= half {
        (total - b, b)
    } else {
        (half, total - half)
    }
}

/// The marker for a cut command stream whose whole text is at `saved` (or could not be
/// saved, and why).
pub fn stream_marker<'a>(
    stream: &str,
    total: usize,
    saved: &'a Result<String, String>,
) -> impl Fn(usize, usize, usize) -> String + 'a {
    let total_bytes = total;
    let stream = stream.to_string();
    move |omitted, head, tail_start| {
        let rest = match saved {
            Ok(path) => format!(
                "the whole {stream} is in {path} inside the sandbox: read the cut part with \
                 read_file path={path} offset={head} length={omitted} (or grep/sed/tail it with \
                 run_command)"
            ),
            Err(why) => format!(
                "the whole {stream} could not be saved in the sandbox ({why}): run the command \
                 again with its output redirected to a file"
            ),
        };
        format!(
            "\n[… hutch cut {omitted} of {total_bytes} bytes of {stream} here (bytes {head}..{tail_start}); {rest} …]\n"
        )
    }
}

/// The marker for a cut file read.
pub fn file_marker(path: &str, offset: usize) -> impl Fn(usize, usize, usize) -> String + '_ {
    move |omitted, head, tail_start| {
        format!(
            "\n[… hutch cut {omitted} bytes here (bytes {}..{} of the file); read them with \
             read_file path={path} offset={} length={omitted} …]\n",
            offset + head,
            offset + tail_start,
            offset + head
        )
    }
}

/// The marker for a cut answer of any other tool (listings): the cut is shown, nothing saved.
pub fn answer_marker(omitted: usize, _head: usize, _tail_start: usize) -> String {
    format!(
        "\n[… hutch cut {omitted} bytes of this answer here; ask for less (a deeper path, a \
         smaller depth) to see them …]\n"
    )
}

/// The marker for cut output of a code cell (which the interpreter does not save).
pub fn code_marker(omitted: usize, _head: usize, _tail_start: usize) -> String {
    format!(
        "\n[… hutch cut {omitted} bytes of this output here; print less, or write it to a \
         file and read parts of it …]\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_left_alone() {
        assert_eq!(cut("abc", 10, |_, _, _| "X".into()), "abc");
    }

    #[test]
    fn long_text_keeps_head_and_tail_and_names_the_cut() {
        let text: String = (1..=2000).map(|i| format!("{i}\n")).collect();
        let out = cut(&text, 100, |omitted, head, tail| {
            format!("[{omitted} {head} {tail}]")
        });
        assert!(out.len() <= 100, "{} bytes", out.len());
        assert!(out.starts_with("1\n2\n3\n"), "{out}");
        assert!(out.ends_with("1999\n2000\n"), "{out}");
        // 100 bytes less the marker's 16 (`[8877 8893 8893]` at most): 42 + 42 kept.
        let omitted = text.len() - 84;
        assert!(
            out.contains(&format!("[{omitted} 42 {}]", text.len() - 42)),
            "{out}"
        );
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        let text = "é".repeat(100);
        let out = cut(&text, 12, |_, _, _| "|".into());
        let (head, tail) = out.split_once('|').expect("marker");
        // 11 bytes of room: 5 for the head (2 whole characters), 6 for the tail (3).
        assert_eq!(head, "éé");
        assert_eq!(tail, "ééé");
    }

    #[test]
    fn budgets_favour_what_fits() {
        assert_eq!(split_budget(10, 20, 100), (10, 20));
        assert_eq!(split_budget(10, 500, 100), (10, 90));
        assert_eq!(split_budget(500, 10, 100), (90, 10));
        assert_eq!(split_budget(500, 500, 100), (50, 50));
    }
}
