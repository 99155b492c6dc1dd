//! The messages of the label cap refusals (`tag_value_limit`, `end_user_limit`): each names the
//! cap that was reached, the workspace's or its key's (issue 40 item 3), and what to do.

/// The message of a label cap refusal: the workspace's cap, or the key's own (`_per_key`).
pub(super) fn label_limit_message(
    over: crate::store::OverCap,
    tag_key: Option<&str>,
    limit: i64,
    per_key: bool,
) -> String {
    use crate::store::OverCap;
    if per_key {
        let prune = "or ask an admin to prune unused ones (DELETE /admin/v1/labels) or raise the cap";
        return match over {
            OverCap::TagKeys => format!(
                "this API key already brought {limit} tag keys to its workspace (max_tag_keys_per_key); \
                 send a tag key it has sent before, {prune}"
            ),
            OverCap::TagValues => format!(
                "this API key already brought {limit} values of tag `{}` to its workspace \
                 (max_tag_values_per_key); send one of the known values, {prune}",
                tag_key.unwrap_or_default()
            ),
            OverCap::EndUsers => format!(
                "this API key already brought {limit} end users to its workspace (max_end_users_per_key); \
                 send a known end user or none, {prune}"
            ),
        };
    }
    match over {
        OverCap::TagKeys => format!(
            "this workspace already has {limit} tag keys (max_tag_keys); send a tag key it has seen, \
             or ask an admin to raise the cap"
        ),
        OverCap::TagValues => format!(
            "tag `{}` already has {limit} values in this workspace (max_tag_values); send one of its \
             known values, or ask an admin to raise the cap",
            tag_key.unwrap_or_default()
        ),
        OverCap::EndUsers => format!(
            "this workspace already has {limit} end users (max_end_users); send a known end user or \
             none, or ask an admin to raise the cap"
        ),
    }
}
