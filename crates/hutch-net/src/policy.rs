//! A sandbox's egress policy: what it is, how it is parsed and validated, and how a
//! destination (an address, a name) is judged against it.
//!
//! Precedence (as in E2B): a destination matching an `allow` entry is allowed; otherwise one
//! matching a `deny` entry is denied; otherwise `egress` decides. `egress: none` means
//! loopback only (no slot at all).

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::addr::Ipv4Net;
use crate::NetError;

/// Most entries in one list.
pub const MAX_ENTRIES: usize = 512;

/// The default for destinations no list names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// Everything not denied is reachable.
    #[default]
    Allow,
    /// Only what is allowed is reachable.
    Deny,
    /// Loopback only: no network interface besides `lo`.
    None,
}

/// One entry of an allow or deny list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// An IPv4 address or network.
    Net(Ipv4Net),
    /// One domain name, exactly (lower case, no trailing dot).
    Domain(String),
    /// `*.suffix`: every name below `suffix` (not `suffix` itself).
    Suffix(String),
}

impl Rule {
    /// Parse one entry.
    pub fn parse(s: &str) -> Result<Rule, NetError> {
        let t = s.trim();
        if t.is_empty() {
            return Err(NetError::Invalid("an empty network rule".into()));
        }
        if t.contains(':') {
            return Err(NetError::Invalid(format!(
                "{t:?}: IPv6 rules are not supported (sandbox networks are IPv4 only)"
            )));
        }
        if t.chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == '/')
        {
            return t.parse::<Ipv4Net>().map(Rule::Net);
        }
        if let Some(rest) = t.strip_prefix("*.") {
            return Ok(Rule::Suffix(normalize_name(rest)?));
        }
        Ok(Rule::Domain(normalize_name(t)?))
    }

    fn matches_name(&self, name: &str) -> bool {
        match self {
            Rule::Domain(d) => d == name,
            Rule::Suffix(s) => name
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.ends_with('.') && head.len() > 1),
            Rule::Net(_) => false,
        }
    }

    fn matches_ip(&self, ip: Ipv4Addr) -> bool {
        matches!(self, Rule::Net(n) if n.contains(ip))
    }

    fn is_name(&self) -> bool {
        !matches!(self, Rule::Net(_))
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Net(n) if n.len == 32 => write!(f, "{}", n.addr),
            Rule::Net(n) => write!(f, "{n}"),
            Rule::Domain(d) => write!(f, "{d}"),
            Rule::Suffix(s) => write!(f, "*.{s}"),
        }
    }
}

/// A domain name in canonical form (lower case, no trailing dot), or an error naming it.
pub fn normalize_name(s: &str) -> Result<String, NetError> {
    let n = s.trim_end_matches('.').to_ascii_lowercase();
    let bad = |why: &str| NetError::Invalid(format!("{s:?} is not a valid domain name: {why}"));
    if n.is_empty() || n.len() > 253 {
        return Err(bad("1-253 characters"));
    }
    for label in n.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad("labels are 1-63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(bad(
                "letters, digits, '-' and '_' only ('*.' only as a prefix)",
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(bad("a label starts or ends with '-'"));
        }
    }
    Ok(n)
}

/// The policy as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Default for destinations no list names.
    #[serde(default)]
    pub egress: Egress,
    /// Always reachable: IPs, CIDRs, names, `*.suffix`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Unreachable unless also allowed.
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    /// Default.
    pub egress: Egress,
    /// Allow list.
    pub allow: Vec<Rule>,
    /// Deny list.
    pub deny: Vec<Rule>,
}

/// A verdict about one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Reachable.
    Allow,
    /// Not reachable.
    Deny,
}

impl Policy {
    /// Validate a spec.
    pub fn from_spec(spec: &PolicySpec) -> Result<Policy, NetError> {
        let parse = |list: &[String], what: &str| -> Result<Vec<Rule>, NetError> {
            if list.len() > MAX_ENTRIES {
                return Err(NetError::Invalid(format!(
                    "network.{what} has {} entries; at most {MAX_ENTRIES}",
                    list.len()
                )));
            }
            list.iter()
                .map(|s| {
                    Rule::parse(s).map_err(|e| NetError::Invalid(format!("network.{what}: {e}")))
                })
                .collect()
        };
        let policy = Policy {
            egress: spec.egress,
            allow: parse(&spec.allow, "allow")?,
            deny: parse(&spec.deny, "deny")?,
        };
        if policy.egress == Egress::None && !(policy.allow.is_empty() && policy.deny.is_empty()) {
            return Err(NetError::Invalid(
                "network: egress \"none\" (loopback only) takes no allow or deny lists".into(),
            ));
        }
        Ok(policy)
    }

    /// The spec form (canonical spelling of every entry).
    pub fn to_spec(&self) -> PolicySpec {
        PolicySpec {
            egress: self.egress,
            allow: self.allow.iter().map(ToString::to_string).collect(),
            deny: self.deny.iter().map(ToString::to_string).collect(),
        }
    }

    /// Whether the sandbox has a network interface at all.
    pub fn networked(&self) -> bool {
        self.egress != Egress::None
    }

    /// Whether names decide anything: then DNS answers are filtered and pinned, ports 80/443
    /// go through the SNI/Host proxy and QUIC is blocked.
    pub fn has_domain_rules(&self) -> bool {
        self.allow.iter().chain(&self.deny).any(Rule::is_name)
    }

    /// Whether the plain default (allow everything, no lists) applies, which needs no
    /// per-sandbox firewall state.
    pub fn is_open(&self) -> bool {
        self.egress == Egress::Allow && self.allow.is_empty() && self.deny.is_empty()
    }

    /// Verdict on a name (DNS and SNI/Host).
    pub fn name(&self, name: &str) -> Verdict {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if self.allow.iter().any(|r| r.matches_name(&name)) {
            Verdict::Allow
        } else if self.deny.iter().any(|r| r.matches_name(&name)) {
            Verdict::Deny
        } else {
            self.default_verdict()
        }
    }

    /// Verdict on an address by the IP rules alone (pins aside).
    pub fn ip(&self, ip: Ipv4Addr) -> Verdict {
        if self.allow.iter().any(|r| r.matches_ip(ip)) {
            Verdict::Allow
        } else if self.deny.iter().any(|r| r.matches_ip(ip)) {
            Verdict::Deny
        } else {
            self.default_verdict()
        }
    }

    /// Whether `ip` is named by an allow entry.
    pub fn ip_explicitly_allowed(&self, ip: Ipv4Addr) -> bool {
        self.allow.iter().any(|r| r.matches_ip(ip))
    }

    fn default_verdict(&self) -> Verdict {
        match self.egress {
            Egress::Allow => Verdict::Allow,
            Egress::Deny | Egress::None => Verdict::Deny,
        }
    }

    /// The networks of one list.
    pub fn nets(&self, allow: bool) -> Vec<Ipv4Net> {
        let list = if allow { &self.allow } else { &self.deny };
        list.iter()
            .filter_map(|r| match r {
                Rule::Net(n) => Some(*n),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(egress: Egress, allow: &[&str], deny: &[&str]) -> Policy {
        Policy::from_spec(&PolicySpec {
            egress,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        })
        .unwrap()
    }

    #[test]
    fn allow_wins_over_deny_then_the_default() {
        let p = policy(
            Egress::Allow,
            &["pypi.org", "10.1.0.0/16"],
            &["pypi.org", "10.0.0.0/8", "*.evil.test"],
        );
        assert_eq!(p.name("PyPI.org."), Verdict::Allow);
        assert_eq!(p.name("x.evil.test"), Verdict::Deny);
        assert_eq!(
            p.name("evil.test"),
            Verdict::Allow,
            "a wildcard does not match its apex"
        );
        assert_eq!(p.ip("10.1.2.3".parse().unwrap()), Verdict::Allow);
        assert_eq!(p.ip("10.2.2.3".parse().unwrap()), Verdict::Deny);
        assert_eq!(p.ip("203.0.113.9".parse().unwrap()), Verdict::Allow);
        assert!(p.has_domain_rules());
        let d = policy(Egress::Deny, &["*.good.test"], &[]);
        assert_eq!(d.name("a.b.good.test"), Verdict::Allow);
        assert_eq!(d.name("notgood.test"), Verdict::Deny);
        assert_eq!(d.ip("203.0.113.9".parse().unwrap()), Verdict::Deny);
    }

    #[test]
    fn bad_entries_are_refused_with_their_name() {
        for bad in [
            "",
            "::1",
            "1.2.3.4/40",
            "a..b",
            "*.",
            "-a.test",
            "a b",
            "x*.test",
        ] {
            let e = Rule::parse(bad).unwrap_err().to_string();
            assert!(!e.is_empty(), "{bad}");
        }
        let spec = PolicySpec {
            egress: Egress::None,
            allow: vec!["a.test".into()],
            deny: vec![],
        };
        assert!(Policy::from_spec(&spec).is_err());
        assert_eq!(
            Rule::parse("*.Good.Test.").unwrap().to_string(),
            "*.good.test"
        );
        assert_eq!(Rule::parse("1.2.3.4").unwrap().to_string(), "1.2.3.4");
    }
}
