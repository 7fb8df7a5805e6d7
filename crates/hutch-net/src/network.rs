//! The running network of one server: slots handed to sandboxes, their policies, the warm
//! pool, and the shared state the resolver and the proxy judge by. They read it; it never
//! names them (`services` starts all three).

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::addr::{Ipv4Net, Pool, SlotAddrs};
use crate::link::{self, BuiltSlot};
use crate::policy::{Policy, Verdict};
use crate::{nft, NetError};

/// How the server's sandbox network is set up.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Private pool of sandbox addresses.
    pub pool: Ipv4Net,
    /// Upstream DNS server the resolver forwards allowed queries to.
    pub upstream_dns: SocketAddr,
    /// TCP ports always refused.
    pub mining_ports: Vec<u16>,
    /// Slots kept built ahead of creates.
    pub warm_slots: usize,
}

impl NetConfig {
    /// Defaults: `10.213.0.0/16`, the first nameserver of `/etc/resolv.conf`, Stratum ports,
    /// four warm slots.
    pub fn new() -> Self {
        Self {
            pool: Ipv4Net {
                addr: Ipv4Addr::new(10, 213, 0, 0),
                len: 16,
            },
            upstream_dns: system_nameserver().unwrap_or(SocketAddr::from(([127, 0, 0, 53], 53))),
            mining_ports: nft::DEFAULT_MINING_PORTS.to_vec(),
            warm_slots: 4,
        }
    }
}

impl Default for NetConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The first `nameserver` of `/etc/resolv.conf`.
pub fn system_nameserver() -> Option<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("nameserver"))
            .then(|| w.next()?.parse::<std::net::IpAddr>().ok())
            .flatten()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

/// A slot handed to a sandbox.
#[derive(Debug, Clone)]
pub struct SlotLease {
    /// Slot number.
    pub index: u32,
    /// Its addresses.
    pub addrs: SlotAddrs,
    /// A path through which another process can join the slot's namespace.
    pub netns_path: PathBuf,
}

/// How many slots are in each state ([`Network::slot_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotCounts {
    /// Held by sandboxes (running or paused; hibernated ones hold none).
    pub used: u64,
    /// Built ahead of creates.
    pub warm: u64,
    /// Neither: left in the address pool.
    pub free: u64,
}

/// Connections and bytes a sandbox sent out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Traffic {
    /// New connections (or UDP flows) out, including through the proxy.
    pub connections_out: u64,
    /// Bytes the sandbox sent (IP packets leaving its interface).
    pub bytes_out: u64,
}

pub(crate) struct Pin {
    pub names: BTreeSet<String>,
    pub expires: Instant,
}

pub(crate) struct Proxied {
    pub name: Option<String>,
    pub dst: Ipv4Addr,
    pub abort: tokio::task::AbortHandle,
}

struct Slot {
    sandbox: String,
    netns: OwnedFd,
    policy: Policy,
    pins: HashMap<Ipv4Addr, Pin>,
    proxied: HashMap<u64, Proxied>,
}

#[derive(Default)]
struct State {
    next_index: u32,
    recycled: Vec<u32>,
    warm: Vec<BuiltSlot>,
    used: HashMap<u32, Slot>,
    refilling: bool,
}

pub(crate) struct Inner {
    pub cfg: NetConfig,
    pub pool: Pool,
    host_ns: OwnedFd,
    state: Mutex<State>,
    /// Held by a policy change and by a pin, each over its state update and its nft run, so
    /// the kernel's pins never hold an address the current policy does not allow (see
    /// [`Network::pin`]).
    rules: Mutex<()>,
    generation: AtomicU32,
    next_conn: AtomicU64,
    pub resolver_port: u16,
    pub proxy_port: u16,
    /// The last traffic counters read from nftables ([`Network::traffic`]).
    counters: crate::cached::Cached<Counters>,
}

/// Traffic counters of every sandbox interface: (connections, bytes) by interface name.
type Counters = HashMap<String, (nft::Counter, nft::Counter)>;

/// How old the traffic counters a call reads may be: one `nft` run serves every sandbox's
/// `GET` and `/metrics` within that time, so reading a sandbox does not spawn `nft`
/// each time.
pub(crate) const COUNTERS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long taking a preferred slot waits for its removal ([`Network::release`] removes
/// links and rules in the background) or its build for the warm pool to finish.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// The sandbox network of one server (cheap to clone).
#[derive(Clone)]
pub struct Network {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("pool", &self.inner.cfg.pool)
            .field("resolver_port", &self.inner.resolver_port)
            .field("proxy_port", &self.inner.proxy_port)
            .finish()
    }
}

impl Network {
    /// The network of a server whose resolver and proxy listen on these ports (started by
    /// [`Network::start`], in `services`, which then hands this to them).
    pub(crate) fn assemble(
        cfg: NetConfig,
        pool: Pool,
        host_ns: OwnedFd,
        resolver_port: u16,
        proxy_port: u16,
    ) -> Network {
        Network {
            inner: Arc::new(Inner {
                cfg,
                pool,
                host_ns,
                state: Mutex::new(State::default()),
                rules: Mutex::new(()),
                generation: AtomicU32::new(1),
                next_conn: AtomicU64::new(1),
                resolver_port,
                proxy_port,
                counters: crate::cached::Cached::new(COUNTERS_MAX_AGE),
            }),
        }
    }

    /// The pool.
    pub fn pool(&self) -> Ipv4Net {
        self.inner.cfg.pool
    }

    /// Ports of the resolver and the proxy in the server's namespace.
    pub fn service_ports(&self) -> (u16, u16) {
        (self.inner.resolver_port, self.inner.proxy_port)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rules_lock(&self) -> MutexGuard<'_, ()> {
        self.inner.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_generation(&self) -> u32 {
        self.inner.generation.fetch_add(1, Ordering::Relaxed)
    }

    fn build(&self, index: u32) -> Result<BuiltSlot, NetError> {
        let addrs = self
            .inner
            .pool
            .slot(index)
            .ok_or_else(|| NetError::PoolExhausted(self.inner.cfg.pool.to_string()))?;
        link::build_slot(&self.inner.host_ns, addrs)
    }

    fn take_index(&self, st: &mut State) -> Result<u32, NetError> {
        if let Some(i) = st.recycled.pop() {
            return Ok(i);
        }
        if st.next_index >= self.inner.pool.capacity() {
            return Err(NetError::PoolExhausted(self.inner.cfg.pool.to_string()));
        }
        st.next_index += 1;
        Ok(st.next_index - 1)
    }

    /// Build warm slots in the background until `warm_slots` are ready.
    pub fn refill(&self) {
        {
            let mut st = self.state();
            if st.refilling || st.warm.len() >= self.inner.cfg.warm_slots {
                return;
            }
            st.refilling = true;
        }
        let net = self.clone();
        let spawned = std::thread::Builder::new()
            .name("hutch-net-refill".into())
            .spawn(move || loop {
                let index = {
                    let mut st = net.state();
                    if st.warm.len() >= net.inner.cfg.warm_slots {
                        st.refilling = false;
                        return;
                    }
                    match net.take_index(&mut st) {
                        Ok(i) => i,
                        Err(_) => {
                            st.refilling = false;
                            return;
                        }
                    }
                };
                match net.build(index) {
                    Ok(slot) => net.state().warm.push(slot),
                    Err(e) => {
                        tracing::warn!(index, error = %e, "building a warm network slot failed");
                        let mut st = net.state();
                        st.recycled.push(index);
                        st.refilling = false;
                        return;
                    }
                }
            });
        if spawned.is_err() {
            self.state().refilling = false;
        }
    }

    /// Hand a slot to `sandbox` with `policy` (which must be networked). Blocks (netlink,
    /// nft) only when no warm slot is ready or the policy is not the open default.
    pub fn acquire(&self, sandbox: &str, policy: &Policy) -> Result<SlotLease, NetError> {
        self.acquire_preferring(sandbox, policy, None)
    }

    /// [`Network::acquire`], taking slot `preferred` when it is free (a woken sandbox gets
    /// its address back), else any slot.
    pub fn acquire_preferring(
        &self,
        sandbox: &str,
        policy: &Policy,
        preferred: Option<u32>,
    ) -> Result<SlotLease, NetError> {
        let built = match preferred.and_then(|p| self.take_preferred(p)) {
            Some(Ok(b)) => Some(b),
            Some(Err((index, e))) => {
                tracing::warn!(index, error = %e, "rebuilding a preferred network slot failed");
                self.state().recycled.push(index);
                None
            }
            None => None,
        };
        let built = match built {
            Some(b) => b,
            None => self.take_any()?,
        };
        self.lease(sandbox, policy, built)
    }

    /// Slot `index` if no sandbox holds it: a warm one as it is, a recycled or never used one
    /// built now (`Err` with its number when the build fails). One being removed (given back
    /// a moment ago) or built for the warm pool is waited for, a little.
    fn take_preferred(&self, index: u32) -> Option<Result<BuiltSlot, (u32, NetError)>> {
        if index >= self.inner.pool.capacity() {
            return None;
        }
        let until = Instant::now() + RELEASE_WAIT;
        loop {
            {
                let mut st = self.state();
                if st.used.contains_key(&index) {
                    return None;
                }
                if let Some(at) = st.warm.iter().position(|w| w.addrs.index == index) {
                    return Some(Ok(st.warm.swap_remove(at)));
                }
                if let Some(at) = st.recycled.iter().position(|i| *i == index) {
                    st.recycled.swap_remove(at);
                    break;
                }
                if index >= st.next_index {
                    // Never built: the numbers skipped to reach it are free for later.
                    let skipped: Vec<u32> = (st.next_index..index).collect();
                    st.recycled.extend(skipped);
                    st.next_index = index + 1;
                    break;
                }
            }
            // Being removed, or built for the warm pool: either ends soon.
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Some(self.build(index).map_err(|e| (index, e)))
    }

    /// A warm slot, or a new one built now.
    fn take_any(&self) -> Result<BuiltSlot, NetError> {
        let warm = self.state().warm.pop();
        Ok(match warm {
            Some(b) => b,
            None => {
                let index = self.take_index(&mut self.state())?;
                match self.build(index) {
                    Ok(b) => b,
                    Err(e) => {
                        self.state().recycled.push(index);
                        return Err(e);
                    }
                }
            }
        })
    }

    /// Give `built` to `sandbox` under `policy`.
    fn lease(
        &self,
        sandbox: &str,
        policy: &Policy,
        built: BuiltSlot,
    ) -> Result<SlotLease, NetError> {
        let index = built.addrs.index;
        if !policy.is_open() {
            let script = nft::apply_policy(index, policy, self.next_generation(), &[]);
            if let Err(e) = nft::run(&script) {
                self.discard(index, built.netns);
                return Err(e);
            }
        }
        let lease = SlotLease {
            index,
            addrs: built.addrs,
            netns_path: fd_path(&built.netns),
        };
        self.state().used.insert(
            index,
            Slot {
                sandbox: sandbox.to_string(),
                netns: built.netns,
                policy: policy.clone(),
                pins: HashMap::new(),
                proxied: HashMap::new(),
            },
        );
        self.refill();
        Ok(lease)
    }

    fn discard(&self, index: u32, netns: OwnedFd) {
        if let Err(e) = link::remove_host_link(&self.inner.host_ns, index) {
            tracing::warn!(index, error = %e, "removing a slot's link failed");
        }
        drop(netns);
        if let Err(e) = nft::run(&nft::remove_slot(index)) {
            tracing::warn!(index, error = %e, "removing a slot's rules failed");
        }
        self.state().recycled.push(index);
    }

    /// The path to join slot `index`'s namespace, if `sandbox` holds it on this server.
    pub fn netns_path(&self, index: u32, sandbox: &str) -> Option<PathBuf> {
        self.state()
            .used
            .get(&index)
            .filter(|s| s.sandbox == sandbox)
            .map(|s| fd_path(&s.netns))
    }

    /// The addresses of slot `index`.
    pub fn slot_addrs(&self, index: u32) -> Option<SlotAddrs> {
        self.inner.pool.slot(index)
    }

    /// Turn slot `index` (held by `sandbox`) into a `vm` slot: a TAP bridged with its `eth0`,
    /// the address left to the guest. Returns the TAP's descriptor for QEMU.
    pub fn attach_tap(&self, index: u32, sandbox: &str) -> Result<OwnedFd, NetError> {
        let ns = {
            let st = self.state();
            let slot = st
                .used
                .get(&index)
                .filter(|s| s.sandbox == sandbox)
                .ok_or_else(|| {
                    NetError::Invalid(format!("slot {index} is not held by {sandbox}"))
                })?;
            slot.netns
                .try_clone()
                .map_err(NetError::sys("duplicate a slot's namespace descriptor"))?
        };
        crate::tap::attach_tap(&ns)
    }

    /// The `resolv.conf` sandboxes of slot `index` get: Hutch's resolver on their gateway.
    pub fn resolv_conf(&self, index: u32) -> Option<String> {
        let a = self.inner.pool.slot(index)?;
        Some(format!("# Hutch: DNS goes through the sandbox's resolver (network policy applies).\nnameserver {}\noptions edns0\n", a.gateway))
    }

    /// The slot whose sandbox address is `address`, if it is one of the pool's.
    pub fn slot_of_address(&self, address: Ipv4Addr) -> Option<u32> {
        self.inner.pool.slot_of(address)
    }

    /// Slots in use by sandboxes, built and ready for the next ones, and left in the pool.
    pub fn slot_counts(&self) -> SlotCounts {
        let st = self.state();
        let used = st.used.len() as u64;
        let warm = st.warm.len() as u64;
        SlotCounts {
            used,
            warm,
            free: u64::from(self.inner.pool.capacity()).saturating_sub(used + warm),
        }
    }

    /// [`Network::release`] if `sandbox` holds slot `index` (a record's slot number may be
    /// stale: another sandbox's now).
    pub fn release_held(&self, index: u32, sandbox: &str) {
        let held = self
            .state()
            .used
            .get(&index)
            .is_some_and(|s| s.sandbox == sandbox);
        if held {
            self.release(index);
        }
    }

    /// Give slot `index` back (its sandbox is gone): rules, link and namespace removed, open
    /// proxied connections cut. Unknown slots are ignored.
    pub fn release(&self, index: u32) {
        let slot = self.state().used.remove(&index);
        if let Some(slot) = slot {
            for p in slot.proxied.values() {
                p.abort.abort();
            }
            // The link, rules and counters go in the background; the number is reused only
            // once they are gone.
            let net = self.clone();
            let spawned = std::thread::Builder::new()
                .name("hutch-net-release".into())
                .spawn(move || net.discard(index, slot.netns));
            if let Err(e) = spawned {
                tracing::warn!(index, error = %e, "no thread to release a slot; leaking it");
            }
        }
    }

    /// Take over slot `index` of a sandbox that outlived a server restart; its namespace is
    /// reached through `netns_path` (e.g. `/proc/<init pid>/ns/net`).
    pub fn adopt(
        &self,
        sandbox: &str,
        index: u32,
        netns_path: &std::path::Path,
        policy: &Policy,
    ) -> Result<SlotLease, NetError> {
        let addrs = self
            .inner
            .pool
            .slot(index)
            .ok_or_else(|| NetError::Invalid(format!("slot {index} is outside the pool")))?;
        let netns: OwnedFd = std::fs::File::open(netns_path)
            .map(OwnedFd::from)
            .map_err(NetError::sys(format!("open {}", netns_path.display())))?;
        nft::run(&nft::apply_policy(
            index,
            policy,
            self.next_generation(),
            &[],
        ))?;
        let mut st = self.state();
        st.next_index = st.next_index.max(index + 1);
        st.recycled.retain(|i| *i != index);
        let lease = SlotLease {
            index,
            addrs,
            netns_path: fd_path(&netns),
        };
        st.used.insert(
            index,
            Slot {
                sandbox: sandbox.to_string(),
                netns,
                policy: policy.clone(),
                pins: HashMap::new(),
                proxied: HashMap::new(),
            },
        );
        Ok(lease)
    }

    /// Remove `hz<N>` links no slot owns (left by a crashed server). Call after adopting.
    pub fn prune(&self) -> Result<usize, NetError> {
        let links = link::list_host_links(&self.inner.host_ns)?;
        let owned: BTreeSet<u32> = {
            let st = self.state();
            st.used
                .keys()
                .copied()
                .chain(st.warm.iter().map(|w| w.addrs.index))
                .collect()
        };
        let mut n = 0;
        for i in links.into_iter().filter(|i| !owned.contains(i)) {
            link::remove_host_link(&self.inner.host_ns, i)?;
            n += 1;
        }
        Ok(n)
    }

    /// Change slot `index`'s policy at once: new rules under a new generation (so open
    /// connections are judged again), pins kept only for names still allowed, proxied
    /// connections the new policy forbids cut. When it returns, the new policy decides every
    /// packet and every DNS answer: an answer that was in flight is judged again and pinned
    /// only if the new policy allows its name ([`Network::pin`]).
    pub fn set_policy(&self, index: u32, policy: &Policy) -> Result<(), NetError> {
        let _rules = self.rules_lock();
        let now = Instant::now();
        let pins: Vec<(Ipv4Addr, u32)> = {
            let mut st = self.state();
            let slot = st
                .used
                .get_mut(&index)
                .ok_or_else(|| NetError::Invalid(format!("slot {index} is not in use")))?;
            slot.pins.retain(|_, p| {
                p.expires > now && p.names.iter().any(|n| policy.name(n) == Verdict::Allow)
            });
            slot.pins
                .iter()
                .map(|(ip, p)| (*ip, (p.expires - now).as_secs().max(1) as u32))
                .collect()
        };
        nft::run(&nft::apply_policy(
            index,
            policy,
            self.next_generation(),
            &pins,
        ))?;
        let mut st = self.state();
        if let Some(slot) = st.used.get_mut(&index) {
            slot.policy = policy.clone();
            let pinned: Vec<(Ipv4Addr, BTreeSet<String>)> = slot
                .pins
                .iter()
                .map(|(ip, p)| (*ip, p.names.clone()))
                .collect();
            slot.proxied.retain(|_, c| {
                let ok = proxy_verdict(policy, &pinned, c.dst, c.name.as_deref()) == Verdict::Allow;
                if !ok {
                    c.abort.abort();
                }
                ok
            });
        }
        Ok(())
    }

    /// The traffic counters, read from nftables at most every [`COUNTERS_MAX_AGE`] (callers
    /// meanwhile wait for the one read in flight, then share it).
    fn counters(&self) -> Result<Arc<Counters>, NetError> {
        self.inner.counters.get(nft::counters)
    }

    /// Traffic of slot `index` so far (counted up to [`COUNTERS_MAX_AGE`] ago).
    pub fn traffic(&self, index: u32) -> Result<Traffic, NetError> {
        let all = self.counters()?;
        Ok(traffic_of(&all, index))
    }

    /// Traffic of every slot in use, by sandbox id (counted up to [`COUNTERS_MAX_AGE`] ago).
    pub fn traffic_all(&self) -> Result<HashMap<String, Traffic>, NetError> {
        let all = self.counters()?;
        let st = self.state();
        Ok(st
            .used
            .iter()
            .map(|(i, s)| (s.sandbox.clone(), traffic_of(&all, *i)))
            .collect())
    }

    // ---- used by the resolver and the proxy ----

    /// The policy of the sandbox at `ip`.
    pub(crate) fn policy_of(&self, ip: Ipv4Addr) -> Option<(u32, Policy)> {
        let index = self.inner.pool.slot_of(ip)?;
        let st = self.state();
        st.used.get(&index).map(|s| (index, s.policy.clone()))
    }

    /// Pin `ips`, which `name` resolved to, for slot `index` (state and nft) if the slot's
    /// policy *now* pins answers for `name` (egress deny, `name` allowed); `Ok(false)` if it
    /// does not (the policy changed while the answer was upstream; the slot is gone), and
    /// nothing is pinned. Serialized with [`Network::set_policy`]: a change that returned
    /// first is judged by here, and a change that comes after sees (and re-judges) the pin.
    pub(crate) fn pin(
        &self,
        index: u32,
        name: &str,
        ips: &[(Ipv4Addr, u32)],
    ) -> Result<bool, NetError> {
        let _rules = self.rules_lock();
        let now = Instant::now();
        let ttls: Vec<(Ipv4Addr, u32)> = ips
            .iter()
            .map(|(ip, ttl)| (*ip, (*ttl).clamp(30, 86_400)))
            .collect();
        {
            let mut st = self.state();
            let Some(slot) = st.used.get_mut(&index) else {
                return Ok(false);
            };
            if !pins_answers_for(&slot.policy, name) {
                return Ok(false);
            }
            if ttls.is_empty() {
                return Ok(true);
            }
            for (ip, ttl) in &ttls {
                let pin = slot.pins.entry(*ip).or_insert_with(|| Pin {
                    names: BTreeSet::new(),
                    expires: now,
                });
                pin.names.insert(name.to_string());
                pin.expires = pin.expires.max(now + Duration::from_secs(u64::from(*ttl)));
            }
        }
        nft::run(&nft::add_pins(index, &ttls))?;
        Ok(true)
    }

    /// Names `ip` was resolved for (unexpired) in slot `index`.
    pub(crate) fn pinned(&self, index: u32) -> Vec<(Ipv4Addr, BTreeSet<String>)> {
        let now = Instant::now();
        let st = self.state();
        st.used.get(&index).map_or_else(Vec::new, |s| {
            s.pins
                .iter()
                .filter(|(_, p)| p.expires > now)
                .map(|(ip, p)| (*ip, p.names.clone()))
                .collect()
        })
    }

    pub(crate) fn track(&self, index: u32, conn: Proxied) -> Option<u64> {
        let id = self.inner.next_conn.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state();
        let slot = st.used.get_mut(&index)?;
        slot.proxied.insert(id, conn);
        Some(id)
    }

    pub(crate) fn untrack(&self, index: u32, id: u64) {
        if let Some(slot) = self.state().used.get_mut(&index) {
            slot.proxied.remove(&id);
        }
    }
}

fn traffic_of(all: &HashMap<String, (nft::Counter, nft::Counter)>, index: u32) -> Traffic {
    let (conns, bytes) = all
        .get(&crate::addr::host_ifname(index))
        .copied()
        .unwrap_or_default();
    Traffic {
        connections_out: conns.packets,
        bytes_out: bytes.bytes,
    }
}

/// Whether the resolver pins the answers for `name` under `policy`: domain rules, egress
/// deny, `name` allowed.
pub(crate) fn pins_answers_for(policy: &Policy, name: &str) -> bool {
    policy.has_domain_rules()
        && policy.egress == crate::policy::Egress::Deny
        && policy.name(name) == Verdict::Allow
}

/// The proxy's verdict on a connection to `dst` naming `name` (SNI or Host).
pub(crate) fn proxy_verdict(
    policy: &Policy,
    pinned: &[(Ipv4Addr, BTreeSet<String>)],
    dst: Ipv4Addr,
    name: Option<&str>,
) -> Verdict {
    if policy.ip_explicitly_allowed(dst) {
        return Verdict::Allow;
    }
    let name_ok = name.is_some_and(|n| policy.name(n) == Verdict::Allow);
    match policy.egress {
        crate::policy::Egress::Allow => {
            let name_denied = name.is_some_and(|n| policy.name(n) == Verdict::Deny);
            if name_denied || policy.ip(dst) == Verdict::Deny {
                Verdict::Deny
            } else {
                Verdict::Allow
            }
        }
        _ => {
            // The address must have been resolved for an allowed name, and the name the
            // client speaks to must itself be allowed: a pinned address cannot be reused
            // for another name.
            let ip_pinned_for_allowed = pinned.iter().any(|(ip, names)| {
                *ip == dst && names.iter().any(|n| policy.name(n) == Verdict::Allow)
            });
            if name_ok && ip_pinned_for_allowed {
                Verdict::Allow
            } else {
                Verdict::Deny
            }
        }
    }
}

/// `/proc/<our pid>/fd/<fd>`: a path other processes can open to reach `fd`'s namespace.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        fd.as_raw_fd()
    ))
}
