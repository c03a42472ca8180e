"""Worker: runs tasks within its declared resources, serves results to peers."""
