//! Membership and placement: every node registers and sees the others; creates go where
//! there is room, through any node, and never past a node's capacity.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::json;

use crate::TestCluster;

#[tokio::test]
async fn every_node_registers_and_any_node_lists_them_for_admins_only() {
    let c = TestCluster::start(&[2, 2, 2]).await;
    for via in 0..3 {
        let v = c.node_list(via).await;
        assert_eq!(v["this_node"], format!("n{}", via + 1), "{v}");
        assert_eq!(v["this_node_health"], "member", "{v}");
        let nodes = v["nodes"].as_array().expect("nodes");
        let ids: Vec<&str> = nodes.iter().filter_map(|n| n["id"].as_str()).collect();
        assert_eq!(ids, ["n1", "n2", "n3"], "{v}");
        for n in nodes {
            assert_eq!(n["state"], "ready", "{n}");
            assert_eq!(n["role"], "all", "{n}");
            assert!(n["epoch"].as_i64().expect("epoch") >= 1, "{n}");
            assert_eq!(n["capacity"]["sandboxes"], 2, "{n}");
            assert!(n["heartbeat_age_ms"].as_i64().expect("age") < 2500, "{n}");
        }
    }
    // A tenant's key may not see the cluster; no key is 401.
    let key = c.nodes[0].tenant_key("acme", "full").await;
    let (status, v) = c.nodes[1]
        .request_as(&key, Method::GET, "/v1/cluster/nodes", None)
        .await;
    assert_eq!(status, 403, "{v}");
    for action in ["cordon", "uncordon", "drain"] {
        let (status, v) = c.nodes[0]
            .request_as(
                &key,
                Method::POST,
                &format!("/v1/cluster/nodes/n2/{action}"),
                None,
            )
            .await;
        assert_eq!(status, 403, "{action}: {v}");
    }
    assert_eq!(c.node(0, "n2").await["state"], "ready");
    // An unknown node or action is 404.
    for path in ["/v1/cluster/nodes/n9/cordon", "/v1/cluster/nodes/n2/reboot"] {
        let (status, v) = c.nodes[1].post(path, serde_json::Value::Null).await;
        assert_eq!(status, 404, "{path}: {v}");
    }
    let status = c.nodes[2]
        .http
        .get(format!("{}/v1/cluster/nodes", c.nodes[2].url))
        .send()
        .await
        .expect("request")
        .status();
    assert_eq!(status, 401);
}

#[tokio::test]
async fn creates_follow_capacity_and_a_full_cluster_is_503_no_capacity() {
    let c = TestCluster::start(&[1, 2, 3]).await;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..6 {
        let resp = c.nodes[0]
            .http
            .post(format!("{}/v1/sandboxes", c.nodes[0].url))
            .bearer_auth(&c.nodes[0].key)
            .json(&json!({}))
            .send()
            .await
            .expect("create");
        assert_eq!(resp.status(), 201);
        let served_by = resp
            .headers()
            .get("x-hutch-node")
            .and_then(|v| v.to_str().ok())
            .expect("x-hutch-node")
            .to_string();
        let v: serde_json::Value = resp.json().await.expect("json");
        let id = v["id"].as_str().expect("id");
        assert_eq!(c.owner(id), served_by, "the node that answered owns it");
        *per_node.entry(served_by).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = [
        ("n1".to_string(), 1),
        ("n2".to_string(), 2),
        ("n3".to_string(), 3),
    ]
    .into();
    assert_eq!(per_node, expected);
    let (status, v) = c.nodes[1].post("/v1/sandboxes", json!({})).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "no_capacity", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("n3: 3/3 sandboxes"),
        "{v}"
    );
    // Freeing room on n1 lets the next create land there.
    let on_n1 =
        c.pg.psql("hutch", "SELECT id FROM sandboxes WHERE node_id = 'n1'");
    assert_eq!(c.nodes[2].kill(&on_n1).await, 204);
    let id = c.nodes[2].create_id(json!({})).await;
    assert_eq!(c.owner(&id), "n1");
}

#[tokio::test]
async fn parallel_creates_through_every_node_never_oversubscribe_a_node() {
    let c = TestCluster::start(&[3, 3, 3]).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let node = &c.nodes[i % 3];
        let (http, url, key) = (node.http.clone(), node.url.clone(), node.key.clone());
        tasks.push(tokio::spawn(async move {
            http.post(format!("{url}/v1/sandboxes"))
                .bearer_auth(key)
                .json(&json!({}))
                .send()
                .await
                .expect("create")
                .status()
                .as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("task"));
    }
    let created = statuses.iter().filter(|s| **s == 201).count();
    let refused = statuses.iter().filter(|s| **s == 503).count();
    assert_eq!((created, refused), (9, 11), "{statuses:?}");
    let counts = c.pg.psql(
        "hutch",
        "SELECT string_agg(node_id || '=' || n, ',' ORDER BY node_id) FROM
            (SELECT node_id, count(*) AS n FROM sandboxes GROUP BY node_id) x",
    );
    assert_eq!(counts, "n1=3,n2=3,n3=3");
    let placements = c.pg.psql("hutch", "SELECT count(*) FROM placements");
    assert_eq!(placements, "0", "every reservation was released");
}

#[tokio::test]
async fn a_tenants_quota_holds_across_nodes_under_parallel_creates() {
    let c = TestCluster::start(&[4, 4, 4]).await;
    c.nodes[0]
        .tenant("acme", json!({"quotas": {"max_sandboxes": 5}}))
        .await;
    let key = c.nodes[0].tenant_key("acme", "full").await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let node = &c.nodes[i % 3];
        let (http, url, key) = (node.http.clone(), node.url.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let resp = http
                .post(format!("{url}/v1/sandboxes"))
                .bearer_auth(key)
                .json(&json!({}))
                .send()
                .await
                .expect("create");
            let status = resp.status().as_u16();
            let v: serde_json::Value = resp.json().await.unwrap_or_default();
            (status, v)
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("task"));
    }
    let created = answers.iter().filter(|(s, _)| *s == 201).count();
    let refused: Vec<&serde_json::Value> = answers
        .iter()
        .filter(|(s, _)| *s == 429)
        .map(|(_, v)| v)
        .collect();
    assert_eq!((created, refused.len()), (5, 15), "{answers:?}");
    for v in &refused {
        assert_eq!(v["error"]["code"], "quota_exceeded", "{v}");
        assert_eq!(v["error"]["quota"], "max_sandboxes", "{v}");
        assert_eq!(v["error"]["limit"], 5, "{v}");
    }
    let spread = c.pg.psql(
        "hutch",
        "SELECT count(DISTINCT node_id) || '/' || count(*) FROM sandboxes WHERE tenant = 'acme'",
    );
    let (nodes, total) = spread.split_once('/').expect("spread");
    assert_eq!(total, "5", "{spread}");
    assert!(
        nodes.parse::<u32>().expect("nodes") >= 2,
        "placed on several nodes: {spread}"
    );
    assert_eq!(c.pg.psql("hutch", "SELECT count(*) FROM placements"), "0");
    // Room again once one goes, through another node than the one that made it.
    let id = answers.iter().find(|(s, _)| *s == 201).expect("one").1["id"]
        .as_str()
        .expect("id")
        .to_string();
    let (status, _) = c.nodes[1]
        .request_as(&key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, v) = c.nodes[2]
        .request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{v}");
}

#[tokio::test]
async fn a_create_from_a_snapshot_or_with_a_volume_runs_where_its_files_are() {
    let c = TestCluster::start(&[3, 3, 3]).await;
    let source = c.create_on("n1").await;
    c.nodes[0].sh_ok(&source, "echo from-n1 > /root/made").await;
    let (status, snap) = c.nodes[0]
        .post(
            &format!("/v1/sandboxes/{source}/snapshots"),
            json!({"name": "seed"}),
        )
        .await;
    assert_eq!(status, 201, "{snap}");
    let snap = snap["id"].as_str().expect("a snapshot id").to_string();
    // Through the other nodes, by id and by name: every create lands on n1, the snapshot's
    // node, though n2 and n3 have more room.
    for (via, reference) in [(1, snap.as_str()), (2, "seed")] {
        let id = c.nodes[via].create_id(json!({"snapshot": reference})).await;
        assert_eq!(
            c.owner(&id),
            "n1",
            "created from {reference} through n{}",
            via + 1
        );
        assert_eq!(c.nodes[via].sh_ok(&id, "cat /root/made").await, "from-n1\n");
    }
    // A volume made through n2 is on n2: a sandbox using it is placed there.
    let volume = c.nodes[1].volume("data", 16).await;
    let id = c.nodes[0]
        .create_id(json!({"volumes": [{"volume": "data", "path": "/data"}]}))
        .await;
    assert_eq!(c.owner(&id), "n2");
    c.nodes[0].sh_ok(&id, "echo kept > /data/f").await;
    // The snapshot on n1 and the volume on n2 cannot be used together.
    let (status, v) = c.nodes[2]
        .post(
            "/v1/sandboxes",
            json!({"snapshot": snap, "volumes": [{"volume": volume, "path": "/data"}]}),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("n1") && message.contains("n2"), "{v}");
}

#[tokio::test]
async fn a_create_goes_to_a_node_that_holds_its_template() {
    let c = TestCluster::start_with_own_templates(&[3, 3, 3]).await;
    // Built through n3: only n3 holds it.
    let n3 = &c.nodes[2];
    let built = n3
        .build_dockerfile_as(
            &n3.key,
            "only-n3",
            "FROM minimal\nRUN echo built-on-n3 > /where\n",
        )
        .await;
    assert_eq!(built["status"], "succeeded", "{built}");
    crate::eventually("the template built on n3 and n3's heartbeat names it", async || {
        c.pg.psql(
            "hutch",
            "SELECT coalesce(bool_or('only-n3' = ANY(templates)), false) FROM nodes WHERE id = 'n3'",
        ) == "t"
    })
    .await;
    // Through n1 (the least loaded would be n1 or n2): placed on n3, twice.
    for _ in 0..2 {
        let id = c.nodes[0].create_id(json!({"template": "only-n3"})).await;
        assert_eq!(c.owner(&id), "n3");
        assert_eq!(c.nodes[0].sh_ok(&id, "cat /where").await, "built-on-n3\n");
    }
    // `minimal`, which every node holds, still goes where there is most room.
    let id = c.nodes[2].create_id(json!({"template": "minimal"})).await;
    assert_ne!(
        c.owner(&id),
        "n3",
        "n3 holds two sandboxes, the others none"
    );
}
