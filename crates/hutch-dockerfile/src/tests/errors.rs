//! Bad Dockerfiles: each error names the right line (after comments and continuations)
//! and the instruction.

use std::collections::BTreeMap;

use crate::{plan, DockerfileError};

fn error(dockerfile: &str) -> DockerfileError {
    plan(dockerfile, &BTreeMap::new(), None).expect_err("the Dockerfile is refused")
}

#[test]
fn an_unknown_instruction_names_its_line() {
    let dockerfile = "# comment\nFROM scratch\n\nRUN true\n# another\nENV A=1\nFOO bar\n";
    let err = error(dockerfile);
    assert_eq!(
        err.to_string(),
        "Dockerfile line 7: unknown instruction \"FOO\""
    );
    assert_eq!(
        err,
        DockerfileError::UnknownInstruction {
            line: 7,
            word: "FOO".to_owned(),
            hint: String::new(),
        }
    );
}

#[test]
fn a_heredoc_the_parser_cannot_see_is_explained() {
    let err = error("FROM scratch\nRUN cat <<EOF > /x\nhello\nEOF\n");
    assert_eq!(err.line(), Some(3));
    assert!(
        err.to_string().starts_with(
            "Dockerfile line 3: unknown instruction \"hello\" (line 2 opens a here-document \
             after other words, which is not supported"
        ),
        "{err}"
    );
}

#[test]
fn line_numbers_count_continuations_and_comments_inside_them() {
    let err =
        error("FROM scratch\nRUN echo a \\\n  # inside the continuation\n  b \\\n\n  c\nBAR\n");
    assert_eq!(err.line(), Some(7));
    assert_eq!(
        err.to_string(),
        "Dockerfile line 7: unknown instruction \"BAR\""
    );

    let err = error(
        "FROM scratch\nRUN <<EOF\nFOO inside a heredoc is fine\nEOF\nCOPY --chmod=abc a /b\n",
    );
    assert_eq!(
        err.to_string(),
        "Dockerfile line 5: --chmod=`abc` is not an octal mode such as 755 or 0644: COPY --chmod=abc a /b"
    );
}

#[test]
fn an_invalid_instruction_starting_on_a_continued_line_names_its_first_line() {
    let err = error("FROM scratch\nENV A=1 \\\n    B=2\nEXPOSE \\\n  http\n");
    assert_eq!(err.line(), Some(4));
    assert!(
        err.to_string()
            .starts_with("Dockerfile line 4: `http` is not a port"),
        "{err}"
    );
    assert!(err.to_string().ends_with(": EXPOSE …"), "{err}");
}

#[test]
fn unsupported_instructions_and_options_are_refused_clearly() {
    let err = error("FROM scratch\nONBUILD RUN make\n");
    assert!(
        err.to_string()
            .starts_with("Dockerfile line 2: ONBUILD is not supported: "),
        "{err}"
    );
    let err = error("FROM scratch\nRUN --mount=type=ssh git clone x\n");
    assert!(
        err.to_string()
            .starts_with("Dockerfile line 2: RUN --mount=type=ssh is not supported"),
        "{err}"
    );
    let err = error("FROM scratch\nRUN --network=host curl x\n");
    assert!(
        err.to_string()
            .contains("RUN --network=host is not supported"),
        "{err}"
    );
    let err = error("FROM scratch\nADD git@github.com:org/repo.git /src\n");
    assert!(
        err.to_string()
            .contains("ADD from a git repository is not supported"),
        "{err}"
    );
}

#[test]
fn option_and_argument_mistakes() {
    for (dockerfile, line, expected) in [
        (
            "FROM scratch\nCOPY --foo=1 a /b\n",
            2,
            "unknown option --foo (COPY takes --from, --chown, --chmod, --link)",
        ),
        (
            "FROM scratch\nCOPY --chown=1 --chown=2 a /b\n",
            2,
            "--chown is given twice",
        ),
        (
            "FROM scratch\nCOPY a b dest\n",
            2,
            "the destination must be a directory ending in /",
        ),
        (
            "FROM scratch\nCOPY https://example.com/x /x\n",
            2,
            "use ADD for URLs",
        ),
        (
            "FROM scratch\nADD --checksum=md5:abc https://example.com/x /x\n",
            2,
            "must be sha256:",
        ),
        (
            "FROM scratch\n\nHEALTHCHECK --interval=5 CMD true\n",
            3,
            "--interval: `5` is not a duration",
        ),
        (
            "FROM scratch\nHEALTHCHECK --retries=-1 CMD true\n",
            2,
            "--retries=`-1` must be a whole number",
        ),
        (
            "FROM scratch\nHEALTHCHECK --timeout=5s NONE\n",
            2,
            "HEALTHCHECK NONE takes no options",
        ),
        (
            "FROM scratch\nHEALTHCHECK --foo=1 CMD true\n",
            2,
            "unknown option --foo",
        ),
        (
            "FROM scratch\nENV A=\"unterminated\n",
            2,
            "matching double-quote",
        ),
        ("FROM scratch\nENV ALONE\n", 2, "ENV needs a value"),
        ("FROM scratch\nSTOPSIGNAL sigterm\n", 2, "is not a signal"),
        (
            "FROM scratch\nEXPOSE 80/icmp\n",
            2,
            "the protocol must be tcp, udp or sctp",
        ),
        (
            "FROM scratch\nRUN --network=bridge true\n",
            2,
            "--network=`bridge` must be default or none",
        ),
        (
            "FROM scratch AS 1st\n",
            1,
            "stage name `1st` must start with a letter",
        ),
        (
            "FROM --foo=x scratch\n",
            1,
            "unknown option --foo (FROM takes --platform)",
        ),
        ("ARG IMAGE\nFROM $IMAGE\n", 2, "is empty after substitution"),
    ] {
        let err = error(dockerfile);
        assert_eq!(err.line(), Some(line), "{dockerfile:?}: {err}");
        assert!(err.to_string().contains(expected), "{dockerfile:?}: {err}");
    }
}

#[test]
fn parser_errors_keep_the_parser_s_line() {
    let err = error("FROM scratch\nSHELL /bin/bash -c\n");
    assert_eq!(err.line(), Some(2), "{err}");
    assert!(matches!(err, DockerfileError::Syntax { .. }), "{err:?}");
    let err = error("FROM scratch\nRUN <<EOF\nno end\n");
    assert!(err.to_string().contains("here-document"), "{err}");
    let err = error("RUN true\n");
    assert_eq!(err.line(), Some(1), "{err}");
    assert_eq!(error(""), DockerfileError::NoStage);
    assert_eq!(error("# only a comment\n"), DockerfileError::NoStage);
}

#[test]
fn long_instructions_are_shortened_in_messages() {
    let long = format!("FROM scratch\nEXPOSE nope {}\n", "8".repeat(4));
    let err = error(&long);
    assert!(err.to_string().ends_with(": EXPOSE nope 8888"), "{err}");
    let very_long = format!("FROM scratch\nUSER ${{X:?{}}}\n", "y".repeat(300));
    let text = error(&very_long).to_string();
    assert!(text.ends_with(" …"), "{text}");
    assert!(text.len() < 600, "{}", text.len());
}

#[test]
fn oversized_dockerfiles_are_refused_before_they_cost_memory() {
    let huge = format!(
        "FROM scratch\n{}",
        "RUN true\n".repeat(crate::MAX_INSTRUCTIONS)
    );
    assert_eq!(
        error(&huge).to_string(),
        format!(
            "the Dockerfile is too large: {} instructions (at most {})",
            crate::MAX_INSTRUCTIONS + 1,
            crate::MAX_INSTRUCTIONS
        )
    );
    let bytes = format!(
        "FROM scratch\n#{}\n",
        "x".repeat(crate::MAX_DOCKERFILE_BYTES)
    );
    assert!(matches!(error(&bytes), DockerfileError::TooLarge { .. }));
    // Doubling a variable stops at the word limit, and a config that keeps growing stops
    // at the configuration limit.
    let doubling = format!(
        "FROM scratch\nENV B=xxxxxxxx\n{}",
        "ENV B=$B$B\n".repeat(20)
    );
    assert!(error(&doubling)
        .to_string()
        .contains("grows past 65536 bytes after substitution"));
    let growing = format!(
        "FROM scratch\nENV B={}\n{}",
        "x".repeat(30_000),
        (0..10)
            .map(|i| format!("ENV C{i}=$B\n"))
            .collect::<String>()
    );
    let err = error(&growing);
    assert!(
        err.to_string()
            .contains("configuration (ENV, ARG, LABEL, EXPOSE, …) grows past"),
        "{err}"
    );
    assert_eq!(err.line(), Some(6), "the fifth copy passes 128 KiB");
}
