"""Workloads: what the load generator replays (`spec`), made by the rag-chat generator (`ragchat`), named
profiles and `load_workload` (`profiles`), trace readers (`traces`), the prefix oracle (`oracle`) and the
pre-run statistics (`stats`)."""
