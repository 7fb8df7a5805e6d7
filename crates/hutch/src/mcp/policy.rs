//! The network a model's sandboxes get: the operator's policy (`hutch mcp --egress … --allow
//! … --deny …`, default `deny` with nothing allowed) is both the default and the ceiling.
//!
//! A model may narrow it (a lower `egress`, fewer `allow` entries, more `deny` entries) but
//! never widen it: whatever the effective policy lets a sandbox reach, the operator's policy
//! lets it reach too. The proof, with `none < deny < allow`:
//! - `egress` ≤ the operator's;
//! - every `allow` entry is one of the operator's (in canonical form), unless the operator's
//!   policy is the open one (`allow` with no deny list), which reaches everything anyway;
//! - the `deny` list holds every operator entry.
//!
//! A destination the effective policy allows then matches an operator `allow` entry (allowed
//! there too: allow wins), or falls to `egress: allow`, so the operator's `egress` is `allow`
//! and the destination is in no operator deny entry (they are all in the effective list).

use anyhow::{bail, Context};
use hutch_core::net::policy::Rule;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

/// How open a sandbox's network is, as a model names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum EgressChoice {
    // Loopback only.
    None,
    // Only what `allow` names.
    Deny,
    // Everything not denied.
    Allow,
}

impl EgressChoice {
    fn rank(self) -> u8 {
        match self {
            EgressChoice::None => 0,
            EgressChoice::Deny => 1,
            EgressChoice::Allow => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            EgressChoice::None => "none",
            EgressChoice::Deny => "deny",
            EgressChoice::Allow => "allow",
        }
    }
}

/// The operator's policy: the default of every sandbox this server creates, and the most a
/// model may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkCeiling {
    egress: EgressChoice,
    allow: Vec<String>,
    deny: Vec<String>,
}

/// What a model asked for in `create_sandbox` (each field `None` = the operator's).
#[derive(Debug, Clone, Default)]
pub struct NetworkRequest {
    /// `egress`.
    pub egress: Option<EgressChoice>,
    /// `allow`.
    pub allow: Option<Vec<String>>,
    /// `deny` (added to the operator's).
    pub deny: Option<Vec<String>>,
}

impl NetworkRequest {
    /// Whether the model asked for anything.
    pub fn is_empty(&self) -> bool {
        self.egress.is_none() && self.allow.is_none() && self.deny.is_none()
    }
}

fn canonical(list: &[String], what: &str) -> anyhow::Result<Vec<String>> {
    list.iter()
        .map(|s| {
            Rule::parse(s)
                .map(|r| r.to_string())
                .with_context(|| format!("{what} entry {s:?}"))
        })
        .collect()
}

impl NetworkCeiling {
    /// From `hutch mcp` flags, validated.
    pub fn new(egress: EgressChoice, allow: &[String], deny: &[String]) -> anyhow::Result<Self> {
        if egress == EgressChoice::None && !(allow.is_empty() && deny.is_empty()) {
            bail!("--egress none (loopback only) takes no --allow or --deny");
        }
        Ok(Self {
            egress,
            allow: canonical(allow, "--allow")?,
            deny: canonical(deny, "--deny")?,
        })
    }

    /// One line for tool descriptions: what a sandbox gets when the model asks for nothing.
    pub fn describe(&self) -> String {
        let list = |l: &[String]| {
            if l.is_empty() {
                "nothing".to_string()
            } else {
                l.join(", ")
            }
        };
        match self.egress {
            EgressChoice::None => "no network at all (egress none: loopback only)".into(),
            EgressChoice::Deny => format!(
                "egress deny: only these destinations are reachable: {}",
                list(&self.allow)
            ),
            EgressChoice::Allow if self.deny.is_empty() => {
                "egress allow: the whole internet is reachable".into()
            }
            EgressChoice::Allow => format!(
                "egress allow: everything but {} is reachable",
                self.deny.join(", ")
            ),
        }
    }

    fn is_open(&self) -> bool {
        self.egress == EgressChoice::Allow && self.deny.is_empty()
    }

    /// The `network` object to create with: the model's request inside this ceiling, or an
    /// error a model can act on.
    pub fn resolve(&self, req: &NetworkRequest) -> anyhow::Result<Value> {
        let egress = req.egress.unwrap_or(self.egress);
        if egress.rank() > self.egress.rank() {
            bail!(
                "egress {:?} is wider than this MCP server allows: its sandboxes get at most \
                 egress {:?} (the operator sets it with `hutch mcp --egress`)",
                egress.name(),
                self.egress.name()
            );
        }
        if egress == EgressChoice::None {
            if req.allow.as_ref().is_some_and(|a| !a.is_empty()) {
                bail!("egress \"none\" (loopback only) takes no allow list");
            }
            return Ok(json!({"egress": "none", "allow": [], "deny": []}));
        }
        let allow = match &req.allow {
            Some(a) => canonical(a, "allow")?,
            None => self.allow.clone(),
        };
        if !self.is_open() {
            let outside: Vec<&String> = allow.iter().filter(|a| !self.allow.contains(a)).collect();
            if !outside.is_empty() {
                let offered = if self.allow.is_empty() {
                    "none".to_string()
                } else {
                    self.allow.join(", ")
                };
                bail!(
                    "allow entries {outside:?} are not in this MCP server's allow list ({offered}); \
                     the operator adds destinations with `hutch mcp --allow NAME`"
                );
            }
        }
        let mut deny = self.deny.clone();
        for d in canonical(req.deny.as_deref().unwrap_or_default(), "deny")? {
            if !deny.contains(&d) {
                deny.push(d);
            }
        }
        Ok(json!({"egress": egress.name(), "allow": allow, "deny": deny}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn nothing_asked_gets_the_operators_policy() {
        let c = NetworkCeiling::new(EgressChoice::Deny, &s(&["PyPI.org."]), &[]).expect("valid");
        assert_eq!(
            c.resolve(&NetworkRequest::default()).expect("ok"),
            json!({"egress": "deny", "allow": ["pypi.org"], "deny": []})
        );
    }

    #[test]
    fn a_model_cannot_widen_egress_or_allow_what_the_operator_did_not() {
        let c = NetworkCeiling::new(EgressChoice::Deny, &s(&["pypi.org"]), &[]).expect("valid");
        let wider = c
            .resolve(&NetworkRequest {
                egress: Some(EgressChoice::Allow),
                ..Default::default()
            })
            .expect_err("allow is wider than deny");
        assert!(
            wider.to_string().contains("at most egress \"deny\""),
            "{wider}"
        );
        let extra = c
            .resolve(&NetworkRequest {
                allow: Some(s(&["pypi.org", "evil.test"])),
                ..Default::default()
            })
            .expect_err("evil.test is not the operator's");
        assert!(extra.to_string().contains("evil.test"), "{extra}");
        let wildcard = c.resolve(&NetworkRequest {
            allow: Some(s(&["*.pypi.org"])),
            ..Default::default()
        });
        assert!(wildcard.is_err(), "a wildcard is wider than its apex");
    }

    #[test]
    fn a_model_can_narrow_and_cannot_drop_the_operators_deny_list() {
        let c = NetworkCeiling::new(EgressChoice::Allow, &[], &s(&["10.0.0.0/8"])).expect("ok");
        let v = c
            .resolve(&NetworkRequest {
                deny: Some(s(&["bad.test"])),
                ..Default::default()
            })
            .expect("narrower");
        assert_eq!(
            v,
            json!({"egress": "allow", "allow": [], "deny": ["10.0.0.0/8", "bad.test"]})
        );
        // With a deny list, an allow entry could reopen a denied address (allow wins).
        assert!(c
            .resolve(&NetworkRequest {
                allow: Some(s(&["10.1.2.3"])),
                ..Default::default()
            })
            .is_err());
        let none = c
            .resolve(&NetworkRequest {
                egress: Some(EgressChoice::None),
                ..Default::default()
            })
            .expect("none is narrower");
        assert_eq!(none["egress"], "none");
    }

    #[test]
    fn the_open_ceiling_takes_any_request() {
        let c = NetworkCeiling::new(EgressChoice::Allow, &[], &[]).expect("ok");
        let v = c
            .resolve(&NetworkRequest {
                egress: Some(EgressChoice::Deny),
                allow: Some(s(&["example.test"])),
                deny: None,
            })
            .expect("ok");
        assert_eq!(v["allow"], json!(["example.test"]));
    }
}
