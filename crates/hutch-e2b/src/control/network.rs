//! E2B's network settings as Hutch's egress policy.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use hutch_core::net::policy::{Egress, PolicySpec};

use super::model::{NetworkConfig, ALL_TRAFFIC};
use super::sandboxes::{body_json, sandbox_of};
use crate::error::{E2bError, E2bResult};
use crate::E2bState;

/// The policy E2B's `allow_internet_access` and `network` ask for (`None`: the server's
/// default). `denyOut: ["0.0.0.0/0"]` (or no internet access) makes everything not in
/// `allowOut` unreachable; other `denyOut` entries are denied; `allowOut` wins.
pub fn policy_of(
    allow_internet_access: Option<bool>,
    network: Option<&NetworkConfig>,
) -> E2bResult<Option<PolicySpec>> {
    if let Some(key) = network.and_then(|n| n.other.keys().next()) {
        return Err(E2bError::bad_request(format!(
            "network.{key} is not supported by Hutch (allowOut, denyOut and \
             allowPublicTraffic are)"
        )));
    }
    let allow = network
        .and_then(|n| n.allow_out.clone())
        .unwrap_or_default();
    let deny_given = network.and_then(|n| n.deny_out.clone()).unwrap_or_default();
    // Internet access (E2B's default, which older SDKs send explicitly) with no lists is
    // the server's default policy.
    if allow_internet_access != Some(false) && allow.is_empty() && deny_given.is_empty() {
        return Ok(None);
    }
    let mut egress = Egress::Allow;
    if allow_internet_access == Some(false) {
        egress = Egress::Deny;
    }
    let mut deny = Vec::new();
    for d in deny_given {
        if d == ALL_TRAFFIC {
            egress = Egress::Deny;
        } else {
            deny.push(d);
        }
    }
    Ok(Some(PolicySpec {
        egress,
        allow,
        deny,
    }))
}

/// The policy to give the manager: on a server without sandbox networking
/// (`--network off`, loopback only), a policy that only denies is already met, so none.
pub fn for_server(state: &E2bState, spec: Option<PolicySpec>) -> Option<PolicySpec> {
    match spec {
        Some(p)
            if state.app.manager.config().network.is_none()
                && p.egress != Egress::Allow
                && p.allow.is_empty() =>
        {
            None
        }
        other => other,
    }
}

/// `PUT /sandboxes/{id}/network`: replaces the policy (omitted lists are cleared).
pub async fn update(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<StatusCode> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let config: NetworkConfig = body_json(&body)?;
    let spec = policy_of(None, Some(&config))?.unwrap_or_default();
    if let Some(spec) = for_server(&state, Some(spec)) {
        state.app.manager.set_network(&id, spec).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(allow: &[&str], deny: &[&str]) -> NetworkConfig {
        NetworkConfig {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn deny_all_with_exceptions_becomes_a_deny_default_with_an_allow_list() {
        let p = policy_of(None, Some(&net(&["10.1.2.3"], &[ALL_TRAFFIC])))
            .expect("valid")
            .expect("a policy");
        assert_eq!(p.egress, Egress::Deny);
        assert_eq!(p.allow, vec!["10.1.2.3"]);
        assert!(p.deny.is_empty());
    }

    #[test]
    fn no_internet_denies_everything_and_nothing_set_is_the_default() {
        let p = policy_of(Some(false), None)
            .expect("valid")
            .expect("a policy");
        assert_eq!(p.egress, Egress::Deny);
        assert!(policy_of(None, None).expect("valid").is_none());
        let p = policy_of(None, Some(&net(&[], &["192.0.2.0/24"])))
            .expect("valid")
            .expect("a policy");
        assert_eq!(
            (p.egress, p.deny),
            (Egress::Allow, vec!["192.0.2.0/24".to_string()])
        );
    }

    #[test]
    fn unsupported_settings_are_refused_by_name() {
        let mut n = NetworkConfig::default();
        n.other.insert("egressProxy".into(), serde_json::json!({}));
        let e = policy_of(None, Some(&n)).expect_err("refused");
        assert!(e.message().contains("egressProxy"), "{}", e.message());
    }
}
