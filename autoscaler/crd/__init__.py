"""The custom resource definitions, their examples, and the generator of their spec schemas."""
