//! Image builds: the template is an OCI image, pulled from a registry (or read from the
//! files a client uploaded) and unpacked by the template store, each layer's download and
//! extraction reported in the build's log as it goes.

use std::sync::Arc;

use hutch_template::{BuildOptions, ImageSource, Progress};

use crate::builds::{Build, BuildRequest, Builder, ImageBuild};
use crate::engine::{blocking, log_progress};
use crate::error::BuildError;
use crate::log::LogStream;

/// Make `request.template` from `image`.
pub(crate) async fn run(
    builder: &Arc<Builder>,
    build: &Arc<Build>,
    request: &BuildRequest,
    image: &ImageBuild,
) -> Result<(), BuildError> {
    build.log(
        None,
        LogStream::Status,
        &format!("image {}", image.reference),
    );
    let source = ImageSource {
        reference: image.reference.clone(),
        pull: request.registry.pull_options(&builder.settings),
        local: image.local.clone(),
        resources: request.sandbox_resources,
    };
    let (cancelled, _following) = build.cancel_flag();
    let options = BuildOptions {
        // An upload is new files under a name that may be the same: always unpacked.
        force: image.force || image.local.is_some(),
        start: image.start.clone(),
        cancel: Some(cancelled.clone()),
        ..BuildOptions::default()
    };
    let manager = builder.manager.clone();
    let (b, name, tag) = (build.clone(), request.template.clone(), request.tag.clone());
    let done = blocking(move || {
        let mut progress = |p: Progress| log_progress(&b, p);
        let store = manager.templates();
        let info = store.build_image(&name, &source, &options, &mut progress)?;
        if let Some(tag) = &tag {
            store.set_tag(&name, tag, info.rev)?;
            b.log(
                None,
                LogStream::Status,
                &format!("tagged {name}:{tag} (revision {})", info.rev),
            );
        }
        Ok(info)
    })
    // A cancel stops the pull at once (between two chunks of a layer's download, or two
    // reads of its extraction), and the template stays as it was.
    .await;
    if let Err(e) = done {
        return Err(if build.cancelled() {
            BuildError::Cancelled
        } else {
            e
        });
    }
    if let Err(e) = builder.manager.collect_template_revisions().await {
        tracing::warn!(error = %e, "collecting unused template revisions");
    }
    Ok(())
}
