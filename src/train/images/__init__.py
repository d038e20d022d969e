"""Container images: .def parsing and lint, .def -> Dockerfile, build drivers."""
