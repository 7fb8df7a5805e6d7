//! Spending caps: daily and monthly budgets of tenants (`quotas.daily_budget`,
//! `quotas.monthly_budget`) and of keys (`daily_budget`, `monthly_budget`), and the
//! `max_cost_micros` of one sandbox, counted in cost micros through the rate card or, on a
//! server without one, in CPU-seconds ([`BudgetUnit`]).
//!
//! - **Refusal**: a create, wake or resume whose tenant, creating key or sandbox has spent
//!   its budget is 429 `quota_exceeded` naming `daily_budget`, `monthly_budget` or
//!   `max_cost_micros` ([`Manager::check_budgets`]); nothing is made or changed.
//! - **Enforcement**: after each sampling round ([`Manager::enforce_budgets`]) the running
//!   sandboxes of whoever has spent a budget are hibernated (or paused,
//!   `Config::budget_action`): never killed, nothing lost. Raising the budget (or the next
//!   day or month) lets them wake.
//!
//! Budgets count what is metered and written: a sandbox may overrun by what it uses in one
//! sampling interval.

use std::sync::Arc;

use super::Manager;
use crate::config::BudgetAction;
use crate::error::CoreResult;
use crate::ids::KeyId;
use crate::model::{SandboxRecord, SandboxState};
use crate::store::{PageRequest, SandboxQuery};
use crate::tenant::quota::{Amount, QuotaExceeded, QuotaName};
use crate::tenant::{Tenant, TenantScope, ADMIN_TENANT};
use crate::time::now_ms;
use crate::usage::{day_and_month_start, BudgetUnit, UsageQuery, UsageTotals};

/// Whose spending an operation adds to.
#[derive(Debug, Clone, Default)]
pub(super) struct Spender {
    pub tenant: Option<Tenant>,
    pub key: Option<KeyId>,
    /// The sandbox's own cap, with its id.
    pub sandbox: Option<(String, u64)>,
}

impl Spender {
    pub(super) fn of(r: &SandboxRecord) -> Self {
        Self {
            tenant: r.tenant.clone(),
            key: r.created_by.clone(),
            sandbox: r.max_cost_micros.map(|m| (r.id.to_string(), m)),
        }
    }
}

impl Manager {
    fn budget_unit(&self) -> BudgetUnit {
        BudgetUnit::of(self.cfg.rate_card.as_ref())
    }

    async fn spent(&self, query: UsageQuery) -> CoreResult<u64> {
        let total = self
            .store
            .usage_groups(&query)
            .await?
            .iter()
            .fold(UsageTotals::default(), |t, g| t.plus(&g.usage));
        Ok(self.budget_unit().spent(&total))
    }

    /// The first cap `spender` has reached, if any.
    pub(super) async fn budget_reached(
        &self,
        spender: &Spender,
    ) -> CoreResult<Option<QuotaExceeded>> {
        let unit = self.budget_unit();
        let (day, month) = day_and_month_start(now_ms());
        let refuse = |owner: &Tenant,
                      quota: QuotaName,
                      limit: u64,
                      used: u64,
                      whose: String,
                      fix: String| {
            QuotaExceeded {
                tenant: owner.clone(),
                quota,
                limit: Amount::Count(limit),
                used: Some(Amount::Count(used)),
                message: format!(
                    "{} of {whose} reached: {used} of {limit} {} spent; {fix}",
                    quota.as_str(),
                    unit.name()
                ),
            }
        };
        if let Some(tenant) = &spender.tenant {
            if let Some(t) = self.store.get_tenant(tenant).await? {
                let q = &t.settings.quotas;
                for (quota, limit, from) in [
                    (QuotaName::DailyBudget, q.daily_budget, day),
                    (QuotaName::MonthlyBudget, q.monthly_budget, month),
                ] {
                    let Some(limit) = limit else { continue };
                    let used = self
                        .spent(UsageQuery::since(TenantScope::Only(tenant.clone()), from))
                        .await?;
                    if used >= limit {
                        return Ok(Some(refuse(
                            tenant,
                            quota,
                            limit,
                            used,
                            format!("tenant {tenant}"),
                            format!("ask an admin to raise it (PATCH /v1/tenants/{tenant})"),
                        )));
                    }
                }
            }
        }
        if let Some(key_id) = &spender.key {
            if let Some(k) = self.store.get_key(key_id).await? {
                for (quota, limit, from) in [
                    (QuotaName::DailyBudget, k.budget.daily_budget, day),
                    (QuotaName::MonthlyBudget, k.budget.monthly_budget, month),
                ] {
                    let Some(limit) = limit else { continue };
                    let used = self
                        .spent(UsageQuery {
                            key_id: Some(key_id.clone()),
                            ..UsageQuery::since(TenantScope::All, from)
                        })
                        .await?;
                    if used >= limit {
                        return Ok(Some(refuse(
                            &k.tenant,
                            quota,
                            limit,
                            used,
                            format!("key {key_id}"),
                            format!("raise it (PATCH /v1/keys/{key_id})"),
                        )));
                    }
                }
            }
        }
        if let (Some((id, limit)), Some(card)) = (&spender.sandbox, self.cfg.rate_card.as_ref()) {
            let total = self
                .store
                .usage_groups(&UsageQuery {
                    resource: Some(id.clone()),
                    ..UsageQuery::since(TenantScope::All, i64::MIN)
                })
                .await?
                .iter()
                .fold(UsageTotals::default(), |t, g| t.plus(&g.usage));
            let used = card.cost_micros(&total);
            if used >= *limit {
                let owner = spender
                    .tenant
                    .clone()
                    .unwrap_or_else(|| Tenant::new(ADMIN_TENANT));
                return Ok(Some(QuotaExceeded {
                    tenant: owner,
                    quota: QuotaName::MaxCostMicros,
                    limit: Amount::Count(*limit),
                    used: Some(Amount::Count(used)),
                    message: format!(
                        "max_cost_micros of sandbox {id} reached: it cost {used} of {limit} micros; it stays hibernated with everything it kept (delete it, or snapshot it and start another)"
                    ),
                }));
            }
        }
        Ok(None)
    }

    /// `QuotaExceeded` (429) when `spender` has reached a cap: checked before a create,
    /// wake or resume.
    pub(super) async fn check_budgets(&self, spender: &Spender) -> CoreResult<()> {
        match self.budget_reached(spender).await? {
            Some(q) => Err(q.into()),
            None => Ok(()),
        }
    }

    /// Hibernate (or pause) every running sandbox whose tenant, key or own cap is reached.
    pub(super) async fn enforce_budgets(self: &Arc<Self>) {
        let query = SandboxQuery {
            scope: TenantScope::All,
            state: Some(SandboxState::Running),
            metadata: Default::default(),
        };
        let Ok(running) = self
            .store
            .list_sandboxes(&query, &PageRequest::default())
            .await
        else {
            return;
        };
        // One check per distinct spender (a tenant's hundred sandboxes cost one query).
        let mut verdicts: std::collections::HashMap<
            (Option<Tenant>, Option<KeyId>),
            Option<QuotaExceeded>,
        > = Default::default();
        for r in running.items {
            let shared = (r.tenant.clone(), r.created_by.clone());
            let reached = match verdicts.get(&shared) {
                Some(v) => v.clone(),
                None => {
                    let v = self
                        .budget_reached(&Spender {
                            sandbox: None,
                            ..Spender::of(&r)
                        })
                        .await
                        .unwrap_or(None);
                    verdicts.insert(shared, v.clone());
                    v
                }
            };
            let reached = match reached {
                Some(q) => Some(q),
                None if r.max_cost_micros.is_some() => {
                    self.budget_reached(&Spender::of(&r)).await.unwrap_or(None)
                }
                None => None,
            };
            if let Some(q) = reached {
                self.stop_for_budget(&r, q).await;
            }
        }
    }

    async fn stop_for_budget(self: &Arc<Self>, r: &SandboxRecord, q: QuotaExceeded) {
        let _op = self.op_lock(&r.id).await;
        let Ok(fresh) = self.load(&r.id).await else {
            return;
        };
        if fresh.state != SandboxState::Running {
            return;
        }
        let why = format!("{} reached", q.quota.as_str());
        tracing::info!(id = %r.id, reason = %q.message, "spending cap: stopping the sandbox");
        let result = match self.cfg.budget_action {
            BudgetAction::Hibernate => self.hibernate_locked(fresh, Some(why)).await.map(|_| ()),
            BudgetAction::Pause => self.pause_locked(fresh, Some(why)).await,
        };
        if let Err(e) = result {
            tracing::error!(id = %r.id, error = %e, "stopping a sandbox over its spending cap");
        }
    }
}
