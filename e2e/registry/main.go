// The local world's OCI registry: the image the world builds is pushed here and pulled from here
// by the node's containerd (by tag and by digest), and the chart is pushed here and installed from
// here by helm, as users install from a real registry. It serves the OCI distribution API of
// go-containerregistry's registry package on one loopback address; blobs are kept on disk under
// -dir, manifests in memory (the world pushes again after a restart).
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:5000", "loopback address to serve on")
	dir := flag.String("dir", "", "directory for blobs (required)")
	flag.Parse()
	if *dir == "" {
		log.Fatal("-dir is required")
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		log.Fatalf("-listen must be a loopback address (got %q)", *listen)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		log.Fatal(err)
	}
	handler := registry.New(
		registry.WithBlobHandler(registry.NewDiskBlobHandler(*dir)),
		// One line per request would drown the world's logs; errors still reach the client.
		registry.Logger(log.New(io.Discard, "", 0)),
	)
	server := &http.Server{
		Addr:              *listen,
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Printf("registry serving on %s, blobs in %s", *listen, *dir)
	log.Fatal(server.ListenAndServe())
}
