//! Typed values inside instructions: durations (`HEALTHCHECK`), ports (`EXPOSE`), modes
//! (`--chmod`), signals (`STOPSIGNAL`) and boolean flags. Each parser returns a reason a
//! user can act on when the text is not valid.

use std::time::Duration;

/// Parses a Go duration (`30s`, `1m30s`, `1.5h`, `500ms`, `0`), as Docker's
/// `HEALTHCHECK` options are.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("`{text}` is not a duration (use e.g. 30s, 1m30s, 500ms)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() || text.starts_with('-') {
        return Err(bad());
    }
    let text_body = text.strip_prefix('+').unwrap_or(text);
    let mut total = 0f64;
    let mut rest = text_body;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        total += number * nanos_per_unit;
        rest = &rest[unit_end..];
    }
    if !total.is_finite() || total > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Parses one `EXPOSE` argument: `port`, `port/protocol` or a range `low-high[/protocol]`,
/// into `port/protocol` strings (protocol `tcp` when not given).
pub(crate) fn ports(text: &str) -> Result<Vec<String>, String> {
    let bad =
        |why: &str| format!("`{text}` is not a port: {why} (EXPOSE takes port[/tcp|udp|sctp])");
    let (range, protocol) = match text.split_once('/') {
        Some((range, protocol)) => (range, protocol.to_ascii_lowercase()),
        None => (text, "tcp".to_owned()),
    };
    if !matches!(protocol.as_str(), "tcp" | "udp" | "sctp") {
        return Err(bad("the protocol must be tcp, udp or sctp"));
    }
    let number = |s: &str| -> Result<u16, String> {
        match s.parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad("ports are numbers from 1 to 65535")),
        }
    };
    let (low, high) = match range.split_once('-') {
        Some((low, high)) => (number(low)?, number(high)?),
        None => {
            let port = number(range)?;
            (port, port)
        }
    };
    if high < low {
        return Err(bad("the range runs backwards"));
    }
    Ok((low..=high).map(|p| format!("{p}/{protocol}")).collect())
}

/// Parses `--chmod`: an octal mode up to `7777`.
pub(crate) fn octal_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text, 8) {
        Ok(mode) if mode <= 0o7777 && !text.is_empty() => Ok(mode),
        _ => Err(format!(
            "--chmod=`{text}` is not an octal mode such as 755 or 0644"
        )),
    }
}

/// Checks a `STOPSIGNAL`: a number, or a name with or without `SIG` (`SIGTERM`, `TERM`,
/// `SIGRTMIN+3`).
pub(crate) fn signal(text: &str) -> Result<String, String> {
    let valid_number = text.parse::<u32>().is_ok_and(|n| (1..=64).contains(&n));
    let name = text.strip_prefix("SIG").unwrap_or(text);
    let valid_name = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '+' || c == '-')
        && name.starts_with(|c: char| c.is_ascii_uppercase());
    if valid_number || valid_name {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "`{text}` is not a signal (use a name such as SIGTERM or a number from 1 to 64)"
        ))
    }
}

/// A boolean flag: `--link` alone is true; `--link=true|false`.
pub(crate) fn boolean(name: &str, value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("true") | Some("1") => Ok(true),
        Some("false") | Some("0") => Ok(false),
        Some(other) => Err(format!("--{name}=`{other}` must be true or false")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert!(duration("30").is_err(), "a unit is required");
        assert!(duration("-1s").is_err());
        assert!(duration("5d").is_err());
        assert!(duration("").is_err());
    }

    #[test]
    fn exposed_ports() {
        assert_eq!(ports("8080"), Ok(vec!["8080/tcp".to_owned()]));
        assert_eq!(ports("8080/tcp"), Ok(vec!["8080/tcp".to_owned()]));
        assert_eq!(ports("53/UDP"), Ok(vec!["53/udp".to_owned()]));
        assert_eq!(
            ports("7000-7002/udp"),
            Ok(vec![
                "7000/udp".into(),
                "7001/udp".into(),
                "7002/udp".into()
            ])
        );
        assert!(ports("http").is_err());
        assert!(ports("0").is_err());
        assert!(ports("70000").is_err());
        assert!(ports("80/icmp").is_err());
        assert!(ports("9-1").is_err());
    }

    #[test]
    fn modes_signals_and_booleans() {
        assert_eq!(octal_mode("755"), Ok(0o755));
        assert_eq!(octal_mode("0644"), Ok(0o644));
        assert!(octal_mode("u+x").is_err());
        assert!(octal_mode("789").is_err());
        assert!(octal_mode("17777").is_err());
        assert!(signal("SIGTERM").is_ok());
        assert!(signal("TERM").is_ok());
        assert!(signal("9").is_ok());
        assert!(signal("SIGRTMIN+3").is_ok());
        assert!(signal("sigterm").is_err());
        assert!(signal("99").is_err());
        assert_eq!(boolean("link", None), Ok(true));
        assert_eq!(boolean("link", Some("false")), Ok(false));
        assert!(boolean("link", Some("maybe")).is_err());
    }
}
