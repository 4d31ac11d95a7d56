"""The controller: Kubernetes and Prometheus I/O, leader election and the reconcile loop."""
