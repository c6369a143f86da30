// Package v20170312: kubexm lab stand-in (see ../../README). Every call fails.
package v20170312

import "errors"

var errStandIn = errors.New("tencentcloud SDK: not available in the kubexm lab build of flanneld (lab stand-in)")

type Client struct{}

func NewClientWithSecretId(id, secret, region string) (*Client, error) { return nil, errStandIn }

type Filter struct {
	Name   *string
	Values []*string
}

type Route struct {
	RouteId              *uint64
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteType            *string
	Enabled              *bool
}

type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

type DescribeRouteTablesRequest struct{ Filters []*Filter }

type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest { return &DescribeRouteTablesRequest{} }
func NewDeleteRoutesRequest() *DeleteRoutesRequest               { return &DeleteRoutesRequest{} }
func NewCreateRoutesRequest() *CreateRoutesRequest               { return &CreateRoutesRequest{} }

func (c *Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errStandIn
}
func (c *Client) DeleteRoutes(*DeleteRoutesRequest) (struct{}, error) { return struct{}{}, errStandIn }
func (c *Client) CreateRoutes(*CreateRoutesRequest) (struct{}, error) { return struct{}{}, errStandIn }
