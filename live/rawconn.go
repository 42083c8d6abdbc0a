package live

import "net"

// rawListener gives the proxy's clients' connections as rawConns
// (rawconn_linux.go).
type rawListener struct{ net.Listener }

func (l rawListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wrapRaw(c), nil
}
