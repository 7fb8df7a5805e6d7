//! Starting a server's network: forwarding, the base ruleset, then the resolver and the
//! egress proxy, which judge by the [`Network`] started here. The one module that names both
//! sides, so the network's state never imports its services.

use crate::addr::Pool;
use crate::network::{NetConfig, Network};
use crate::{netns, nft, proxy, resolver, NetError};

impl Network {
    /// Set up the network in the calling thread's namespace: forwarding on, the base
    /// ruleset, the resolver and the proxy (on ports chosen now). Needs a tokio runtime.
    pub async fn start(cfg: NetConfig) -> Result<Network, NetError> {
        let pool = Pool::new(cfg.pool)?;
        let host_ns = netns::current()?;
        let (udp, tcp_dns) = resolver::bind().await?;
        let proxy = tokio::net::TcpListener::bind(("0.0.0.0", 0))
            .await
            .map_err(NetError::sys("bind the egress proxy"))?;
        let resolver_port = udp
            .local_addr()
            .map_err(NetError::sys("resolver address"))?
            .port();
        let proxy_port = proxy
            .local_addr()
            .map_err(NetError::sys("proxy address"))?
            .port();
        netns::write_sysctl("net/ipv4/ip_forward", "1")?;
        let base = nft::BaseRules {
            pool: cfg.pool,
            resolver_port,
            proxy_port,
            mining_ports: cfg.mining_ports.clone(),
        };
        let script = nft::base_ruleset(&base);
        tokio::task::spawn_blocking(move || nft::run(&script))
            .await
            .map_err(|e| NetError::Invalid(format!("nft task: {e}")))??;
        let net = Network::assemble(cfg, pool, host_ns, resolver_port, proxy_port);
        resolver::spawn(net.clone(), udp, tcp_dns);
        proxy::spawn(net.clone(), proxy);
        Ok(net)
    }
}
