# The ghcrsync image: a static binary on distroless/static (no shell, no package manager),
# running as a non-root user. Build with `make image` (scripts/build-image.sh).
FROM golang:1.26 AS build
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ghcrsync ./cmd/ghcrsync

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ghcrsync /usr/local/bin/ghcrsync
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/ghcrsync"]
