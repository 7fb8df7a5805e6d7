//! The store contract: every case runs against `SqliteStore` (a temporary directory) and
//! against `PostgresStore` (node `a` on a PostgreSQL server of the test's own), so the two
//! are proven to answer alike: the same records, orders, pages and errors.
//!
//! Cases are `async fn(&dyn Store)` in `contract/*.rs`; `contract!` makes one test per case
//! and backend (`sqlite::NAME`, `postgres::NAME`).

mod support;

#[path = "contract/logs.rs"]
mod logs;
#[path = "contract/records.rs"]
mod records;
#[path = "contract/sandboxes.rs"]
mod sandboxes;
#[path = "contract/tenancy.rs"]
mod tenancy;

/// One `#[tokio::test]` per case and backend.
macro_rules! contract {
    ($($module:ident :: $case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let backend = crate::support::Backend::sqlite();
                    crate::$module::$case(backend.store()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let backend = crate::support::Backend::postgres().await;
                    crate::$module::$case(backend.store()).await;
                }
            )*
        }
    };
}

contract!(
    sandboxes::records_are_inserted_updated_and_deleted,
    sandboxes::modify_changes_one_record_and_can_refuse,
    sandboxes::concurrent_modifies_never_undo_each_other,
    sandboxes::a_scoped_lookup_finds_only_the_tenants_sandbox_and_never_a_warm_guest,
    sandboxes::pages_return_every_row_once_while_rows_are_inserted_and_deleted,
    sandboxes::listings_filter_by_state_and_metadata,
    sandboxes::the_reaper_idle_layer_and_volume_queries_select_their_rows,
    sandboxes::refreshes_move_times_only_later_and_skip_deleted_records,
    records::snapshots_are_named_listed_hidden_and_deleted,
    records::volumes_are_found_by_id_or_name_within_their_scope,
    tenancy::tenants_are_made_changed_and_deleted_with_their_keys,
    tenancy::a_tenant_that_owns_anything_is_not_deleted,
    tenancy::usage_counts_live_sandboxes_leaves_out_the_excluded_and_windows_creates,
    tenancy::keys_list_by_tenant_in_pages_and_uses_only_move_later,
    tenancy::a_template_name_is_claimed_once,
    logs::audit_entries_page_in_order_by_every_filter,
    logs::usage_rows_sum_by_group_and_window_and_meters_come_back,
);
