//! The `code-interpreter` built-in template: Python with a Jupyter kernel, numpy, pandas and
//! matplotlib (charts render to PNG without a display), and Node.js — what the code
//! interpreter's contexts run on.

use hutch_testkit::TestServer;
use serde_json::json;

#[tokio::test]
async fn it_has_a_jupyter_kernel_the_data_libraries_and_node() {
    hutch_testkit::ensure_template("code-interpreter");
    let s = TestServer::start().await;
    let id = s
        .create_id(json!({"template": "code-interpreter", "isolation": "ns", "disk_mib": 2048}))
        .await;
    let script = r#"
import io, json
import numpy as np, pandas as pd, matplotlib
import matplotlib.pyplot as plt
import ipykernel, jupyter_client
df = pd.DataFrame({"x": np.arange(5), "y": np.arange(5) ** 2})
fig, ax = plt.subplots()
ax.plot(df.x, df.y)
buf = io.BytesIO()
fig.savefig(buf, format="png")
png = buf.getvalue()
print(json.dumps({"backend": matplotlib.get_backend(), "sum": int(df.y.sum()),
                  "png": png[:8].hex(), "kernelspec": bool(jupyter_client.kernelspec.find_kernel_specs())}))
"#;
    s.put_file(&id, "/tmp/check.py", "0644", script.as_bytes().to_vec())
        .await;
    let out = s.sh_ok(&id, "python3 /tmp/check.py").await;
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["sum"], 30, "{v}");
    assert_eq!(
        v["backend"].as_str().map(str::to_lowercase).as_deref(),
        Some("agg")
    );
    assert_eq!(v["png"], "89504e470d0a1a0a", "a PNG came out: {v}");
    assert_eq!(
        v["kernelspec"], true,
        "a python3 kernel spec is installed: {v}"
    );
    let node = s.sh_ok(&id, "node -e 'console.log(6 * 7)'").await;
    assert_eq!(node.trim(), "42");
}
