# The unity batches of the merged test executables (QUOTA_TESTS_MERGED, tests/CMakeLists.txt):
# the test files after each `batch` are compiled as one translation unit of their group's
# executable. The files of a batch must not define the same name at file scope (each
# file's anonymous namespace becomes the batch's); the merged builds (QUOTA_TESTS_MERGED:
# the dev, asan and tsan presets) compile them. A test file in no batch is compiled on its own,
# which is always correct: a new test joins a batch only once it compiles beside the others.
set(QUOTA_TEST_UNITY_BATCHES
  batch broken_limiters_test clock_test fair_share_period_test fair_share_test
        fair_weighted_max_min_test fixed_window_test http_test keyed_states_test
  batch leased_limiter_test limiter_test local_store_test policy_extremes_test
        policy_properties_test restart_safety_test sharded_store_test sliding_log_test
  batch sliding_window_estimate_test token_bucket_test verify_envelope_brute_test
        verify_envelope_exact_test verify_envelope_policies_test verify_monitor_test
  batch rule_file_errors_test rule_file_examples_test rule_file_lease_test
        rule_file_sliding_log_test rule_file_test rule_file_fair_share_test
  batch gateway_attempt_deadline_test gateway_conversions_test gateway_eviction_test
        gateway_key_state_test gateway_fair_metrics_test gateway_fair_newcomer_test
  batch gateway_limits_test gateway_metrics_test gateway_request_cost_test gateway_rollout_test
        gateway_rules_test gateway_settle_test gateway_window_rules_test
  batch gateway_lease_test gateway_lease_envelope_test gateway_lease_revoke_test gateway_test
        gateway_fair_share_test gateway_fair_weights_test
  batch gateway_attempt_errors_test gateway_fail_mode_test gateway_estimate_formula_test
        gateway_fair_reserve_test
  batch redis_auth_test redis_coalesce_test redis_concurrency_test redis_connection_test
        redis_differential_test redis_key_layout_test
  batch redis_durability_test redis_failover_safety_differential_test redis_lease_test
        redis_state_version_test redis_lua_syntax_test redis_region_lease_test
  batch redis_store_all_or_nothing_test redis_store_attempts_test redis_store_batch_test
        redis_store_errors_test redis_store_estimate_test redis_store_limiter_test
        redis_store_memory_test redis_store_ttl_test redis_failover_safety_test
  batch redis_token_bucket_reply_test redis_wide_range_test redis_eviction_policy_test
        redis_region_pool_differential_test redis_region_pool_refill_test redis_subscriber_test
  batch redis_gateway_attempt_cluster_test redis_gateway_coalesce_test
        redis_gateway_differential_test redis_gateway_failover_differential_test
        redis_gateway_faults_test redis_gateway_lease_revoke_cluster_test
  batch redis_gateway_keys_test redis_gateway_lease_test redis_gateway_levels_test
        redis_gateway_rule_sets_differential_test redis_gateway_rules_test
  batch redis_gateway_cluster_test redis_gateway_kinds_test redis_gateway_lease_revoke_test
        redis_gateway_reply_test redis_gateway_tickets_test
  batch redis_cluster_batch_test redis_cluster_failover_safety_test redis_cluster_failover_test
        redis_cluster_routing_test redis_cluster_tryagain_test
  batch fair_holder_split_test fair_newcomer_parts_test region_envelope_test
  batch redis_breaker_test redis_region_pool_test testing_redis_server_test
  batch redis_gateway_attempt_errors_test redis_gateway_fair_shared_test
  batch testing_replay_test testing_fault_backend_test scope_router_test
  batch gateway_lease_non_blocking_test gateway_attempts_test
)
